"""Self-speculation (docs/drafters.md, "Self-speculation"): the target drafts for itself.

`skipset`: which attention and MLP sublayers a layer-skipping draft pass leaves out (Draft &
Verify), and the skip-set artifact `draftwise skip search` writes.  `adapter`: Kangaroo's
trained adapter on a shallow exit, and its artifact.  The draft pass itself is a backend
(`backends/layer_skip.py`) sharing the target's loaded modules; the proposers that drive it are
`proposers/layer_skip.py` and `proposers/kangaroo.py`.
"""
