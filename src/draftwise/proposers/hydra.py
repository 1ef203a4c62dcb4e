"""Hydra: K dependent heads, each conditioned on the embeddings of its path (docs/drafters.md,
"Draft heads")."""

from draftwise.proposers.heads import family

FAMILY = family("hydra", "trained dependent heads read the target's state and their path's tokens (a stage per level)")
