"""Kangaroo's shallow-feature reuse (HEADS.md sections 7 and 8): a verify forward that starts
at the declared layer boundary for the rows whose shallow states the draft already computed.

The draft (the target's first l layers, on `LayerSkipBackend` with `record_boundary = l`)
computed, for the pending token and the drafted tokens it fed, the residual stream after layer
l and the KV rows of layers 0..l-1: the same modules on the same tokens at the same positions
as the target's own first l layers, so the architecture proves them equal (up to the float
rounding of a different batch shape).  That is necessary, not sufficient: a row is reused only
where `may_reuse` holds, i.e. every metadata field of the offered row equals the one the
target wants for that row: checkpoint, layer boundary, token id, position, ancestry hash (every
token before it and itself), dtype and the target cache's generation (bumped whenever its rows
are dropped or cut).  Reuse covers the leading rows of a chain round whose fields all match;
every other row runs the full stack.  A provisional tensor never becomes authoritative because
its token was accepted: the reused KV rows enter the target's cache as provisional verify
rows, committed or dropped with the round like any other.

`ShallowReuseBackend` is the transformers backend with this one addition; offering is one-shot
(`offer` before a verify; the verify consumes it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from draftwise.backends.layer_skip import attention_cache_kwarg, check_decoder, run_layers
from draftwise.backends.transformers import TorchLogits, TransformersBackend
from draftwise.topology.compile import CompiledRound


@dataclass(frozen=True)
class ShallowMeta:
    """What must be equal for a shallow row to stand in for the target's own (HEADS.md section 8)."""

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
    """The transformers target, whose chain verify may start at the boundary for offered rows."""

    def __init__(self, model, tokenizer, info) -> None:
        super().__init__(model, tokenizer, info)
        check_decoder(model)
        self._attn_kwarg = attention_cache_kwarg(model)
        self._tokens: list[int] = []  # committed tokens (their rows are in the cache)
        self.generation = 0
        self._offered: list[ShallowRow] = []
        self._plan: list[ShallowRow] = []
        self._pending = -1
        self.last_reused = 0  # rows the last verify took from the offer
        self.reused_total = 0  # over the backend's life
        self.boundary: int | None = None  # the declared layer boundary (the adapter's exit layer); None: no reuse

    @classmethod
    def of(cls, target: TransformersBackend) -> "ShallowReuseBackend":
        """The same loaded model and tokenizer (nothing copied)."""
        return cls(target.model, target.tokenizer, target.info)

    # ---- the committed tokens and the cache generation ---------------------------------------
    def reset(self) -> None:
        super().reset()
        self._tokens = []
        self.generation += 1

    def truncate(self, length: int) -> None:
        if length < self._committed:
            self.generation += 1
            del self._tokens[length:]
        super().truncate(length)

    def extend(self, tokens: Sequence[int]) -> TorchLogits:
        logits = super().extend(tokens)
        self._tokens.extend(int(t) for t in tokens)
        return logits

    def commit(self, accepted_rows: Sequence[int]) -> None:
        round_ = self._round
        super().commit(accepted_rows)
        self._tokens.append(self._pending)
        if round_ is not None:
            self._tokens.extend(int(round_.token_ids[r]) for r in accepted_rows)

    def wanted(self, token: int, position: int, path: Sequence[int], boundary: int) -> ShallowMeta:
        """The metadata a row of the next verify must carry: `path` = the tokens after the
        committed ones up to and including `token`."""
        return ShallowMeta(self.info.checkpoint, boundary, int(token), position,
                           ancestry([*self._tokens, *path]), self.info.dtype, self.generation)

    # ---- the offer and the verify ---------------------------------------------------------------
    def declare_boundary(self, boundary: int) -> None:
        """The layer boundary offered rows must sit at (Kangaroo: the adapter's exit layer)."""
        if not 1 <= boundary < len(self.model.model.layers):
            raise ValueError(f"boundary {boundary} outside the model's layers")
        self.boundary = boundary

    def offer(self, rows: Sequence[ShallowRow]) -> None:
        self._offered = list(rows)

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> TorchLogits:
        chain = round_ is None or bool(np.array_equal(round_.parent, np.arange(-1, round_.n - 1)))
        self._plan = self._reusable(pending, round_) if chain and not unread else []
        self._offered = []
        try:
            logits = super().verify(pending, round_, unread)
        finally:
            self._plan = []
        self._pending = int(pending)
        self._tokens.extend(int(t) for t in unread)  # read and committed by this verify
        return logits

    def _reusable(self, pending: int, round_: CompiledRound | None) -> list[ShallowRow]:
        """The leading rows of [pending, candidates] whose offered row may be reused."""
        boundary = self.boundary
        if not self._offered or boundary is None:
            return []
        by_position = {row.meta.position: row for row in self._offered}
        tokens = [int(pending)] + ([] if round_ is None else [int(t) for t in round_.token_ids])
        start = self._committed
        plan: list[ShallowRow] = []
        for j, token in enumerate(tokens):
            row = by_position.get(start + j)
            if row is None or not may_reuse(row.meta, self.wanted(token, start + j, tokens[: j + 1], boundary)):
                break
            plan.append(row)
        return plan

    def _forward(self, ids: list[int], positions: torch.Tensor | None, mask: torch.Tensor | None, keep: int):
        plan = self._plan
        self.last_reused = len(plan)
        self.reused_total += len(plan)
        if not plan:
            return super()._forward(ids, positions, mask, keep)
        if self._cache is None:
            self.reset()
        self._check_room(len(ids))
        before = self._committed + self._pending_rows
        rows, boundary = len(ids), plan[0].meta.boundary  # == the declared one (may_reuse checked it)
        assert positions is not None
        if mask is None:  # a chain: row i sees the cache and rows <= i ([R, before + R])
            mask = self._additive(torch.arange(before + rows)[None] <= torch.arange(before, before + rows)[:, None])
        try:
            with torch.inference_mode():
                logits = self._from_boundary(ids, positions, mask, keep, plan, boundary, before)
        except BaseException:
            self._crop_to(before)
            raise
        self._last_hidden = None
        return logits

    def _from_boundary(self, ids: list[int], positions: torch.Tensor, mask: torch.Tensor, keep: int,
                       plan: list[ShallowRow], boundary: int, before: int) -> torch.Tensor:
        inner = self.model.model
        m = len(plan)
        for i in range(boundary):  # the offered rows' KV enter the shallow layers as provisional rows
            layer = self._cache.layers[i]
            keys = torch.stack([row.kv[i][0] for row in plan], dim=1)[None]  # [1, H_kv, M, D]
            values = torch.stack([row.kv[i][1] for row in plan], dim=1)[None]
            layer.update(keys, values)
        x = inner.embed_tokens(torch.tensor([ids], dtype=torch.long, device=self.device))  # [1, R, d]
        rope = inner.rotary_emb(x, positions)
        rest = (rope[0][:, m:], rope[1][:, m:])
        shallow = run_layers(self.model, x[:, m:], rest, mask[:, :, m:], self._cache, range(boundary), None,
                             self._attn_kwarg) if m < len(ids) else x[:, m:]  # [1, R - M, d]
        reused = torch.stack([row.x for row in plan])[None]  # [1, M, d]
        x = torch.cat([reused, shallow], dim=1)  # [1, R, d]
        x = run_layers(self.model, x, rope, mask, self._cache, range(boundary, len(inner.layers)), None,
                       self._attn_kwarg)  # every row runs the deep layers
        return self.model.lm_head(inner.norm(x[:, -keep:]))[0]  # [keep, V]
