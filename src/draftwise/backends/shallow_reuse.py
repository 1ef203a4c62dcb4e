"""Kangaroo's shallow-feature reuse (docs/drafters.md, "Kangaroo"): a chain verify that starts at
the declared layer boundary for the rows whose shallow states the draft already computed (the
target's own first l layers on the same tokens and positions).  A row is reused only where
`may_reuse` holds: every metadata field of the offered row equals the one the target wants.
Reused KV rows enter the cache as provisional verify rows, committed or dropped with the round.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from draftwise.backends.layer_skip import attention_cache_kwarg, check_decoder, run_layers
from draftwise.backends.transformers import TransformersBackend
from draftwise.backends.transformers_batch import TransformersBatch, _is_chain
from draftwise.runtime.logits import TargetLogits
from draftwise.topology.compile import CompiledRound


@dataclass(frozen=True)
class ShallowMeta:
    """What must be equal for a shallow row to stand in for the target's own (docs/drafters.md, "Kangaroo")."""

    checkpoint: str
    boundary: int  # layers below it are the shallow ones
    token: int
    position: int
    ancestry: str  # sha256 of the tokens at positions 0..position
    dtype: str
    generation: int  # the target cache's generation the row extends


def may_reuse(offered: ShallowMeta, wanted: ShallowMeta) -> bool:
    """Every field equal; any mismatch disables reuse of the row."""
    return offered == wanted


def ancestry(tokens: Sequence[int]) -> str:
    return hashlib.sha256(",".join(str(int(t)) for t in tokens).encode()).hexdigest()


@dataclass(frozen=True, eq=False)
class ShallowRow:
    meta: ShallowMeta
    x: torch.Tensor  # [d] the residual stream after the boundary
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer below the boundary: keys, values [H_kv, D]


class ShallowReuseBackend(TransformersBackend):
    """The transformers target, whose chain verify may start at the boundary for offered rows
    (the slots keep the committed tokens and the cache generation the metadata is checked against)."""

    batch: ShallowReuseBatch

    def __init__(self, model, tokenizer, info) -> None:
        check_decoder(model)
        super().__init__(model, tokenizer, info, ShallowReuseBatch)
        self._offered: list[ShallowRow] = []
        self.last_reused = 0  # rows the last verify took from the offer
        self.reused_total = 0  # over the backend's life
        self.boundary: int | None = None  # the declared layer boundary (the adapter's exit layer); None: no reuse

    @classmethod
    def of(cls, target: TransformersBackend) -> "ShallowReuseBackend":
        """The same loaded model and tokenizer (nothing copied)."""
        return cls(target.model, target.tokenizer, target.info)

    @property
    def generation(self) -> int:
        """The target cache's generation: bumped whenever its rows are dropped or cut."""
        return self.batch.generation(self.slot)

    def declare_boundary(self, boundary: int) -> None:
        """The layer boundary offered rows must sit at (Kangaroo: the adapter's exit layer)."""
        if not 1 <= boundary < len(self.model.model.layers):
            raise ValueError(f"boundary {boundary} outside the model's layers")
        self.boundary = boundary

    def offer(self, rows: Sequence[ShallowRow]) -> None:
        self._offered = list(rows)

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> TargetLogits:
        chain = round_ is None or _is_chain(round_)
        plan = self._reusable(pending, round_) if chain and not unread else []
        self._offered = []
        self.last_reused = len(plan)
        self.reused_total += len(plan)
        self.batch.plan = plan
        try:
            return super().verify(pending, round_, unread)
        finally:
            self.batch.plan = []

    def _reusable(self, pending: int, round_: CompiledRound | None) -> list[ShallowRow]:
        """The leading rows of [pending, candidates] whose offered row may be reused."""
        boundary = self.boundary
        if not self._offered or boundary is None:
            return []
        by_position = {row.meta.position: row for row in self._offered}
        tokens = [int(pending)] + ([] if round_ is None else [int(t) for t in round_.token_ids])
        committed, start, generation = self.batch.committed_tokens(self.slot), self.cached_len, self.generation
        plan: list[ShallowRow] = []
        for j, token in enumerate(tokens):  # what row j must carry: its token, position and every token before it
            row = by_position.get(start + j)
            wanted = ShallowMeta(self.info.checkpoint, boundary, token, start + j,
                                 ancestry([*committed, *tokens[: j + 1]]), self.info.dtype, generation)
            if row is None or not may_reuse(row.meta, wanted):
                break
            plan.append(row)
        return plan


class ShallowReuseBatch(TransformersBatch):
    """The slotted backend whose next forward (a lone chain verify) starts at the boundary for
    the rows of `plan`: their KV enters the layers below it as provisional rows, their residual
    stream enters the layers above it; every other row runs the whole stack."""

    def __init__(self, backend: Any, max_slots: int = 1) -> None:
        super().__init__(backend, max_slots)
        self._attn_kwarg = attention_cache_kwarg(self.model)
        self.plan: list[ShallowRow] = []

    def _model_call(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: Any,
                    keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        plan = self.plan
        if not plan:
            return super()._model_call(ids, positions, mask, cache, keep, hidden)
        inner, m, boundary = self.model.model, len(plan), plan[0].meta.boundary  # == the declared one (may_reuse)
        past, rows = int(cache.layers[0].keys.shape[2]), ids.shape[1]
        if mask is None:  # a chain: row i sees the cache and rows <= i ([R, past + R])
            mask = self._additive((torch.arange(past + rows)[None] <= torch.arange(past, past + rows)[:, None])[None])
        for i in range(boundary):
            keys = torch.stack([row.kv[i][0] for row in plan], dim=1)[None]  # [1, H_kv, M, D]
            values = torch.stack([row.kv[i][1] for row in plan], dim=1)[None]
            cache.layers[i].update(keys, values)
        x = inner.embed_tokens(ids)  # [1, R, d]
        rope = inner.rotary_emb(x, positions)
        rest = (rope[0][:, m:], rope[1][:, m:])
        shallow = run_layers(self.model, x[:, m:], rest, mask[:, :, m:], cache, range(boundary), None,
                             self._attn_kwarg) if m < rows else x[:, m:]  # [1, R - M, d]
        x = torch.cat([torch.stack([row.x for row in plan])[None], shallow], dim=1)  # [1, R, d]
        x = run_layers(self.model, x, rope, mask, cache, range(boundary, len(inner.layers)), None,
                       self._attn_kwarg)  # every row runs the deep layers
        return self.model.lm_head(inner.norm(x[:, -keep:])), None  # [1, keep, V]; no hidden states
