"""A draft pass through the target's own modules with sublayers skipped (HEADS.md sections 6-8).

`LayerSkipBackend` shares the target's loaded `nn.Module` (no second copy of the weights) and
runs it sublayer by sublayer: the embedding, the rotary embedding, each layer's
`input_layernorm` + `self_attn` and `post_attention_layernorm` + `mlp` (each left out where the
skip set says so: a skipped sublayer adds nothing to the residual stream), then an exit: the
target's final norm and LM head, or a Kangaroo adapter and the LM head.  No modeling code is
copied or patched: these are the modules the model's own forward calls, in its order.

State (HEADS.md section 8): the draft keeps its OWN cache, with rows only for the layers whose
attention it runs (and the adapter's); the target's authoritative cache is never read or
written.  The backend is the transformers backend's state machine (extend, verify,
verify_more, commit, rollback, truncate, with explicit position ids and additive 4D masks)
over that cache, so `DraftModelProposer` drives it as it drives a separate draft model:
chains with a confidence stop, trees level by level, prefix sync and rollback with the round.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Callable, Protocol

import torch
from torch import nn

from draftwise.backends.base import BackendInfo
from draftwise.errors import BackendError
from draftwise.backends.transformers import TransformersBackend
from draftwise.selfdraft.skipset import SkipSet

# the decoder families whose layer is exactly pre-norm attention then pre-norm MLP, each added
# to the residual stream (checked by the empty-skip test); others are refused, not guessed at
SUPPORTED = ("llama", "qwen2")


class DraftExit(Protocol):
    """What turns the residual stream after the last layer run into the LM head's input."""

    def __call__(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                 attention_mask: torch.Tensor | None, cache: object) -> torch.Tensor: ...

    def cache_layers(self) -> int:
        """Cache layers of its own (an adapter's attention), after the model's."""


class LayerSkipBackend(TransformersBackend):
    """The target with `skip` applied, as a draft backend.  `exit`: None = the target's final
    norm and LM head; else a module mapping the last run layer's residual stream [1, R, d] to
    the LM head's input (Kangaroo's adapter)."""

    def __init__(self, target: TransformersBackend, skip: SkipSet, exit: DraftExit | None = None,
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
        super().__init__(target.model, target.tokenizer, info)
        self.skip = skip
        self.exit = exit
        # what makes two passes over one model the same draft: the skip set and the exit's weights
        # (`exit_key`: the adapter's manifest hash; a batch shares one pass among its requests by it)
        self.pass_key = f"{self.info.checkpoint}|exit:{exit_key if exit is not None else 'lm-head'}"
        self._attn_cache_kwarg = attention_cache_kwarg(target.model)
        # Kangaroo: the layer boundary whose rows a verify may reuse (None: record nothing)
        self.record_boundary: int | None = None
        self._shallow: dict[int, tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...]]] = {}

    def reset(self) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        super().reset()
        self._shallow = {}
        cache = DynamicCache(config=self.model.config)
        for _ in range(self.exit.cache_layers() if self.exit is not None else 0):
            cache.layers.append(DynamicLayer())  # the adapter's attention: layer index L, L + 1, ...
        self._cache = cache

    def track_hidden(self, on: bool = True) -> None:
        if on:
            raise BackendError("a layer-skipping draft pass exposes no target hidden states")

    def _forward(self, ids: list[int], positions: torch.Tensor | None, mask: torch.Tensor | None, keep: int):
        """Logits [keep, V] of the last `keep` rows of the skipped pass; a failure part way cuts
        every layer back to the rows it held before (as the target's forward does)."""
        if self._cache is None:
            self.reset()
        self._check_room(len(ids))
        before = self._committed + self._pending_rows
        rows = len(ids)
        if positions is None:
            positions = torch.arange(before, before + rows, device=self.device)[None]  # [1, R]
        if mask is None and rows > 1:
            # the base class leaves chains to the model's causal default; a composed pass
            # states it: row i sees the cache and rows <= i ([R, before + R])
            mask = self._additive(torch.arange(before + rows)[None] <= torch.arange(before, before + rows)[:, None])
        try:
            with torch.inference_mode():
                logits = self._skipped_pass(torch.tensor([ids], dtype=torch.long, device=self.device), positions,
                                            mask, keep)
        except BaseException:
            self._crop_to(before)
            raise
        self._last_hidden = None
        return logits  # [keep, V]

    def _skipped_pass(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                      keep: int) -> torch.Tensor:
        boundary = self.record_boundary
        # Kangaroo: keep the residual stream at the boundary of every row (its shallow feature)
        seen = None if boundary is None else (lambda x: self._record(positions[0], x[0]))
        logits = composed_pass(self.model, self.skip, self.exit, input_ids, positions, mask, self._cache, keep,
                               self._attn_cache_kwarg, boundary, seen)
        return logits[0]  # [keep, V]

    # ---- shallow rows (a verify forward may start at the boundary: backends/shallow_reuse.py) ----
    def _record(self, positions: torch.Tensor, x: torch.Tensor) -> None:
        """Rows at `positions` [R]: x [R, d] after the boundary, and the KV rows the boundary's
        layers just appended (each [H_kv, R, D])."""
        rows = x.shape[0]
        for j, position in enumerate(positions.tolist()):
            # copies: a view would pin every superseded cache tensor (each extend concatenates anew)
            kv = tuple((self._cache.layers[i].keys[0, :, j - rows].clone(),
                        self._cache.layers[i].values[0, :, j - rows].clone())
                       for i in range(self.record_boundary or 0))
            self._shallow[int(position)] = (x[j].clone(), kv)

    def shallow_row(self, position: int) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...]] | None:
        """(x [d], per layer below the boundary (keys [H_kv, D], values [H_kv, D])) of the row the
        draft holds at `position`, or None (not computed, or cut since)."""
        return self._shallow.get(position) if position < self._committed + self._pending_rows else None

    def forget_shallow(self, below: int) -> None:
        """Drop the recorded rows before position `below` (committed on the target: never offered again)."""
        for position in [p for p in self._shallow if p < below]:
            del self._shallow[position]

    def _crop_to(self, length: int) -> None:
        super()._crop_to(length)
        for position in [p for p in getattr(self, "_shallow", {}) if p >= length]:
            del self._shallow[position]


def draft_pass_host(target: object) -> TransformersBackend | None:
    """The transformers backend whose loaded model a draft pass composes for `target`: the target
    itself, or, for a slot of a transformers batch (or the batch), the backend the batch shares;
    None where there is none (llama.cpp).  In a batch the requests' passes over it share one
    composed batch (`backends/layer_skip_batch.py`): the weights are shared, each request's draft
    rows are its own slot's."""
    if isinstance(target, TransformersBackend):
        return target
    backend = getattr(getattr(target, "batch", target), "backend", None)
    return backend if isinstance(backend, TransformersBackend) else None


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
