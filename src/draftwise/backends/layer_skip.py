"""A draft pass through the target's own modules with sublayers skipped (docs/drafters.md, "Self-speculation").

The pass shares the target's loaded `nn.Module` and runs it sublayer by sublayer, in the
model's own order (no modeling code copied or patched), leaving out what the skip set says,
then exits through the final norm or a Kangaroo adapter and the LM head.  Its KV is its own
(the layers whose attention it runs).  `LayerSkipBatch` runs it on slots (in a batch, every
request's draft step is one composed forward); `LayerSkipBackend`, a draft backend, is a view
of a one-slot instance.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any, Callable, Protocol

import torch
from torch import nn

from draftwise.backends.base import BackendInfo
from draftwise.errors import BackendError
from draftwise.backends.transformers import TransformersBackend
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.selfdraft.skipset import SkipSet

# x [d] after the boundary and, per layer below it, (keys [H_kv, D], values [H_kv, D]): one row's shallow state
ShallowState = tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...]]

# the decoder families whose layer is exactly pre-norm attention then pre-norm MLP, each added
# to the residual stream (checked by the empty-skip test); others are refused, not guessed at
SUPPORTED = ("llama", "qwen2")


class DraftExit(Protocol):
    """What turns the residual stream after the last layer run into the LM head's input."""

    def __call__(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                 attention_mask: torch.Tensor | None, cache: object) -> torch.Tensor: ...

    def cache_layers(self) -> int:
        """Cache layers of its own (an adapter's attention), after the model's."""


class LayerSkipBatch(TransformersBatch):
    """`TransformersBatch` whose forward is `draft`'s composed pass (a `LayerSkipBackend`, or
    what one is made of: its model, tokenizer, info, skip set and exit)."""

    causal_default = False  # the model's forward builds that default, and it is not called

    def __init__(self, draft: Any, max_slots: int = 8) -> None:
        layers = int(draft.model.config.num_hidden_layers)
        own = draft.exit.cache_layers() if draft.exit is not None else 0
        self.skip, self.exit = draft.skip, draft.exit
        self._held = list(draft.skip.attention_layers) + list(range(layers, layers + own))  # tensor i -> cache layer
        self._cache_size = layers + own
        self._attn_kwarg = attention_cache_kwarg(draft.model)
        # Kangaroo: the boundary at which a lone pass records its rows' shallow states (None: none);
        # a batch's shared verify runs every request's rows from layer 0, so a batch records nothing
        self.record_boundary: int | None = None
        self._shallow: dict[int, ShallowState] = {}  # by position
        super().__init__(draft, max_slots)

    def _held_layers(self) -> int:
        return len(self._held)

    def _wrap_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
        if self._cache is None:
            from transformers import DynamicCache

            data: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)] * self._cache_size
            for index, k, v in zip(self._held, keys, values):
                data[index] = (k[:, :, :0], v[:, :, :0])
            self._cache = DynamicCache(ddp_cache_data=data)  # a layer without data stays an empty layer
        for index, k, v in zip(self._held, keys, values):
            self._cache.layers[index].keys, self._cache.layers[index].values = k, v
        return self._cache

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
        boundary = self.record_boundary if ids.shape[0] == 1 else None
        seen = None if boundary is None else (lambda x: self._record(positions[0], x[0], cache, boundary))
        logits = composed_pass(self.model, self.skip, self.exit, ids, positions, mask, cache, keep, self._attn_kwarg,
                               boundary, seen)
        return logits, None  # [B', keep, V]

    def track_hidden(self, slot: int, on: bool = True) -> None:
        if on:
            raise BackendError("a layer-skipping draft pass exposes no target hidden states")

    # ---- shallow rows (a verify forward may start at the boundary: backends/shallow_reuse.py) ----
    def _record(self, positions: torch.Tensor, x: torch.Tensor, cache: Any, boundary: int) -> None:
        """Rows at `positions` [R]: x [R, d] after the boundary, and the KV rows the layers below
        it just appended (each [H_kv, D]); copies, since a view would pin every superseded tensor."""
        rows = x.shape[0]
        for j, position in enumerate(positions.tolist()):
            kv = tuple((cache.layers[i].keys[0, :, j - rows].clone(), cache.layers[i].values[0, :, j - rows].clone())
                       for i in range(boundary))
            self._shallow[int(position)] = (x[j].clone(), kv)

    def shallow_row(self, slot: int, position: int) -> ShallowState | None:
        """The shallow state of the row the slot holds at `position` (a chain's column is its
        position, and every forward records its rows: a row below the slot's end was recorded
        after any cut), or None."""
        state = self._slot(slot)
        return self._shallow.get(position) if position < state.committed + state.rows else None

    def forget_shallow(self, slot: int, below: int) -> None:
        """Drop the rows before position `below` (committed on the target: never offered again)
        and those past the slot's end (cut)."""
        state = self._slot(slot)
        for position in [p for p in self._shallow if p < below or p >= state.committed + state.rows]:
            del self._shallow[position]


class LayerSkipBackend(TransformersBackend):
    """The target with `skip` applied, as a draft backend: a view of a one-slot `LayerSkipBatch`.
    `exit`: None = the target's final norm and LM head; else a module mapping the last run
    layer's residual stream [B, R, d] to the LM head's input (Kangaroo's adapter)."""

    batch: LayerSkipBatch

    def __init__(self, target: TransformersBackend | TransformersBatch, skip: SkipSet, exit: DraftExit | None = None,
                 label: str = "layer-skip", exit_key: str = "") -> None:
        config = target.model.config
        check_decoder(target.model)
        skip.check(int(config.num_hidden_layers))
        running = len(skip.attention_layers) + (exit.cache_layers() if exit is not None else 0)
        per_layer = target.info.kv_row_bytes // max(int(config.num_hidden_layers), 1)
        info: BackendInfo = replace(
            target.info,
            name=f"{target.info.name}+{label}",
            checkpoint=f"{target.info.checkpoint}#{label}:{skip.digest()[:12]}",
            kv_row_bytes=per_layer * running,
        )
        self.skip, self.exit = skip, exit  # what the pass composes (read by LayerSkipBatch)
        super().__init__(target.model, target.tokenizer, info, LayerSkipBatch)
        # what makes two passes over one model the same draft: the skip set and the exit's weights
        # (`exit_key`: the adapter's manifest hash; a batch shares one pass among its requests by it)
        self.pass_key = f"{self.info.checkpoint}|exit:{exit_key if exit is not None else 'lm-head'}"

    # ---- shallow rows (Kangaroo: a verify may start at the boundary, backends/shallow_reuse.py) ----
    @property
    def record_boundary(self) -> int | None:
        """The layer boundary whose rows this pass records for a verify to reuse (None: none)."""
        return self.batch.record_boundary

    @record_boundary.setter
    def record_boundary(self, boundary: int | None) -> None:
        self.batch.record_boundary = boundary

    def shallow_row(self, position: int) -> ShallowState | None:
        return self.batch.shallow_row(self.slot, position)

    def forget_shallow(self, below: int) -> None:
        self.batch.forget_shallow(self.slot, below)


def draft_pass_host(target: object) -> TransformersBackend | TransformersBatch | None:
    """What a draft pass composes the loaded model of for `target`: the target itself, or, for a
    slot of a transformers batch (or the batch), the batch; None where there is none (llama.cpp).
    In a batch the requests' passes share one composed batch (`backends/layer_skip_batch.py`)."""
    if isinstance(target, TransformersBackend):
        return target
    batch = getattr(target, "batch", target)
    return batch if isinstance(batch, TransformersBatch) else None


def composed_pass(model: nn.Module, skip: SkipSet, exit: DraftExit | None, input_ids: torch.Tensor,
                  positions: torch.Tensor, mask: torch.Tensor | None, cache: object, keep: int, attn_kwarg: str,
                  boundary: int | None = None, at_boundary: Callable[[torch.Tensor], None] | None = None,
                  ) -> torch.Tensor:
    """The skipped pass over input_ids and positions [B, R] (mask [B, 1, R, K] additive, or None
    for the model's causal default of one sequence): logits [B, keep, V] of the last `keep` rows.
    Attention appends every row to `cache` (the layers it runs, then the exit's).  `at_boundary`
    sees the residual stream [B, R, d] after layer `boundary`."""
    inner = model.model
    x = inner.embed_tokens(input_ids)  # [B, R, d]
    rope = inner.rotary_emb(x, positions)  # (cos, sin), each [B, R, head_dim]
    split = skip.depth if boundary is None else boundary
    x = run_layers(model, x, rope, mask, cache, range(split), skip, attn_kwarg)
    if at_boundary is not None:
        at_boundary(x)
    x = run_layers(model, x, rope, mask, cache, range(split, skip.depth), skip, attn_kwarg)
    if exit is None:
        h = inner.norm(x[:, -keep:])  # [B, keep, d]
    else:
        h = exit(x, rope, mask, cache)[:, -keep:]  # every row feeds the adapter's own cache
    return model.lm_head(h)  # type: ignore[no-any-return]  # [B, keep, V]


def run_layers(model: nn.Module, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
               cache: object, layers: range, skip: SkipSet | None, attn_kwarg: str) -> torch.Tensor:
    """The residual stream x [B, R, d] through `layers` of `model`, each sublayer left out where
    `skip` says (None: every sublayer runs); attention appends its rows to `cache`."""
    for i in layers:
        layer = model.model.layers[i]
        if skip is None or not skip.skips_attention(i):
            attended, _ = layer.self_attn(hidden_states=layer.input_layernorm(x), position_embeddings=rope,
                                          attention_mask=mask, **{attn_kwarg: cache})
            x = x + attended  # [B, R, d]
        if skip is None or not skip.skips_mlp(i):
            x = x + layer.mlp(layer.post_attention_layernorm(x))  # [B, R, d]
    return x


def check_decoder(model: nn.Module) -> None:
    """Refuse a model whose layers are not the pre-norm attention + MLP this pass composes."""
    config = model.config
    kind = getattr(config, "model_type", "?")
    if kind not in SUPPORTED:
        raise BackendError(f"layer skipping composes the decoder layers of {', '.join(SUPPORTED)} models; "
                           f"{kind} is not one of them")
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        raise BackendError("layer skipping builds full causal masks; this model uses sliding-window attention")


def attention_cache_kwarg(model: nn.Module) -> str:
    """The attention module's cache argument: `cache` in recent transformers, `past_key_values` before."""
    params = inspect.signature(model.model.layers[0].self_attn.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise BackendError("this transformers version's attention takes no cache argument draftwise knows")
