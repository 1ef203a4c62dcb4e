"""The drafter families draftwise ships: one registration line each (see `family.py`)."""

from __future__ import annotations

from draftwise.proposers import clover, draft_model, hydra, hydra_plus, kangaroo, layer_skip, medusa, prompt_lookup
from draftwise.proposers.family import DrafterRegistry
from draftwise.proposers.retrieval import proposer as rest

DRAFTERS = DrafterRegistry([
    prompt_lookup.FAMILY,
    draft_model.FAMILY,
    rest.FAMILY,
    medusa.FAMILY,
    hydra.FAMILY,
    hydra_plus.FAMILY,
    clover.FAMILY,
    layer_skip.FAMILY,
    kangaroo.FAMILY,
])
