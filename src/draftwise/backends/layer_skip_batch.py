"""A self-drafter's composed pass for many requests in one forward: `LayerSkipBatch`.

Layer skip and Kangaroo draft with the target's own modules (`backends/layer_skip.py`: the
layers a skip set keeps, then the final norm or Kangaroo's adapter, then the LM head).  In a
batch each request keeps its own draft rows, and until now each drafted on a pass of its own:
B requests cost B composed forwards per draft step.  `LayerSkipBatch` is `TransformersBatch`
(slots in the batch rows of one cache, per-row positions and 4D masks, `draft_many`) with the
composed pass as its forward, so every request's draft step of a round (an extend, a tree's
first level, its next level) is ONE composed forward over the shared weights.

Cache.  The tensors hold only the layers whose attention the pass runs, then the exit's own
(Kangaroo's adapter attends at layer index L): `_held` maps tensor i to its cache layer.  A
wrapped cache has every layer index the modules address; a layer the pass skips is an empty
layer, and one that gained rows is a mapping error, refused.

Masks.  The composed pass has no causal default of its own (the model's forward builds that,
and it is not called): every forward gets its 4D mask, a lone chain's included.

`ComposedDrafts` keeps one `LayerSkipBatch` per distinct pass (skip set and exit weights,
`LayerSkipBackend.pass_key`) for one batch decoder: each request's self-drafter opens a slot on
it (its own draft KV), closed when the request leaves.  Kangaroo's shallow-row reuse stays a
single-request device (the batch's shared verify runs every request's rows from layer 0), so a
batch pass records nothing at the boundary.
"""

from __future__ import annotations

from typing import Any

import torch

from draftwise.backends.batch import DraftSlot
from draftwise.backends.layer_skip import LayerSkipBackend, attention_cache_kwarg, composed_pass
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.errors import BackendError


class LayerSkipBatch(TransformersBatch):
    """`TransformersBatch` whose forward is `draft`'s composed pass (see the module docstring)."""

    causal_default = False

    def __init__(self, draft: LayerSkipBackend, max_slots: int = 8) -> None:
        layers = int(draft.model.config.num_hidden_layers)
        own = draft.exit.cache_layers() if draft.exit is not None else 0
        self.draft = draft
        self._held = list(draft.skip.attention_layers) + list(range(layers, layers + own))
        self._cache_size = layers + own
        self._attn_kwarg = attention_cache_kwarg(draft.model)
        super().__init__(draft, max_slots)

    @classmethod
    def from_backend(cls, backend: Any, max_slots: int = 8) -> "LayerSkipBatch":
        if not isinstance(backend, LayerSkipBackend):
            raise BackendError(f"a composed batch runs a layer-skipping draft pass, not {type(backend).__name__}")
        return cls(backend, max_slots)

    def _held_layers(self) -> int:
        return len(self._held)

    def _wrap_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
        from transformers import DynamicCache

        data: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)] * self._cache_size
        for index, k, v in zip(self._held, keys, values):
            data[index] = (k[:, :, :0], v[:, :, :0])
        cache: Any = DynamicCache(ddp_cache_data=data)  # a layer without data stays an empty layer
        for index, k, v in zip(self._held, keys, values):
            cache.layers[index].keys, cache.layers[index].values = k, v
        return cache

    def _unwrap_cache(self, cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        held = set(self._held)
        for index, layer in enumerate(cache.layers):
            if index not in held and isinstance(layer.keys, torch.Tensor) and layer.keys.numel():
                raise BackendError(f"layer {index}'s attention is skipped, yet the pass wrote KV rows for it")
        keys, values = [], []
        for index in self._held:
            layer = cache.layers[index]
            if not (isinstance(layer.keys, torch.Tensor) and isinstance(layer.values, torch.Tensor)):
                raise BackendError(f"the draft pass kept no KV rows for layer {index}")
            keys.append(layer.keys)
            values.append(layer.values)
        return keys, values

    def _model_call(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: Any,
                    keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if hidden:
            raise BackendError("a layer-skipping draft pass exposes no target hidden states")
        draft = self.draft
        logits = composed_pass(draft.model, draft.skip, draft.exit, ids, positions, mask, cache, keep,
                               self._attn_kwarg)
        return logits, None  # [B', keep, V]

    def track_hidden(self, slot: int, on: bool = True) -> None:
        if on:
            raise BackendError("a layer-skipping draft pass exposes no target hidden states")


class ComposedDrafts:
    """The composed draft passes of one batch decoder: a `LayerSkipBatch` per distinct pass, a
    slot on it per request (see the module docstring)."""

    def __init__(self, max_slots: int) -> None:
        self.max_slots = max_slots
        self._batches: dict[str, LayerSkipBatch] = {}

    def slot(self, draft: LayerSkipBackend) -> DraftSlot:
        """A slot of the batch running `draft`'s pass, for one request (close it when it leaves)."""
        batch = self._batches.get(draft.pass_key)
        if batch is None:
            batch = self._batches[draft.pass_key] = LayerSkipBatch(draft, self.max_slots)
        return DraftSlot(batch, batch.open())
