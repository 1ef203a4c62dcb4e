"""The self-drafters' composed passes of one batch decoder (`ComposedDrafts`): a `LayerSkipBatch`
(`backends/layer_skip.py`) per distinct pass, shared by every request that drafts with it, so a
round's draft steps cost one composed forward per level for the whole batch.
"""

from __future__ import annotations

from draftwise.backends.batch import DraftSlot
from draftwise.backends.layer_skip import LayerSkipBackend, LayerSkipBatch


class ComposedDrafts:
    """The composed draft passes of one batch decoder: a `LayerSkipBatch` per distinct pass (skip
    set and exit weights, `LayerSkipBackend.pass_key`), a slot on it per request (its own draft
    KV), closed when the request leaves."""

    def __init__(self, max_slots: int) -> None:
        self.max_slots = max_slots
        self._batches: dict[str, LayerSkipBatch] = {}

    def slot(self, draft: LayerSkipBackend) -> DraftSlot:
        """A slot of the batch running `draft`'s pass, for one request (close it when it leaves)."""
        batch = self._batches.get(draft.pass_key)
        if batch is None:
            batch = self._batches[draft.pass_key] = LayerSkipBatch(draft, self.max_slots)
        return DraftSlot(batch, batch.open())
