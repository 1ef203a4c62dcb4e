"""vLLM as a peer and a deployment target: its checkpoint, its offline runs, the exported
speculative_config and draftwise drafters inside it (`custom_class`).

vLLM lives in its own environment (`scripts/setup_vllm.sh` -> `.venv-vllm`): it pins a
transformers draftwise's `.venv` does not carry.  So nothing in this package imports vllm at
module level; the modules that need it (`worker`, `proposer`) run inside `.venv-vllm` and are
reached through a subprocess (`draftwise.vllm.runner`), never imported by draftwise's library.
"""
