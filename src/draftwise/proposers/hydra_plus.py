"""Hydra++: Hydra's dependent heads with deeper MLPs and, optionally, a prefix-attention layer
over the context feeding them (docs/training.md, "Hydra++ and Clover"; the teacher loss is a
training option)."""

from draftwise.proposers.heads import family

FAMILY = family("hydra++", "Hydra heads, deeper, distilled from the target, optionally fed by a prefix-attention "
                           "layer over the context (a stage per level)")
