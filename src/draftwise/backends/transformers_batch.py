"""Many requests on one loaded transformers model: slots in the batch rows of one KV cache.

Cache layout.  The backend owns, per layer, K and V tensors [B, H, L, D] whose batch row b is
one open slot's sequence (`_Slot.row`).  Slots keep their own lengths: slot i's committed rows
are columns [0, c_i) of its batch row, its provisional rows (after a verify) columns
[p_i, p_i + k_i) with p_i >= c_i, and every other column of its row (up to the common length L)
is padding, never visible to it.  A slot's rows sit in its own batch row, so no query ever
meets another slot's keys; the per-row additive mask only hides the slot's own padding.
Padding is always finite (zeros, or rows computed from real inputs), so a masked column
weighs exactly 0 after the softmax and never turns a row into NaN.

One forward.  `verify_many` evaluates every call WITHOUT unread rows (the decode rounds) in
ONE forward: input_ids [B', R] (R = the most rows of a call, shorter calls padded), position
ids [B', R] as the single backend computes them (arange for a pending token and a chain, the
round's positions for a tree), and an additive mask [B', 1, R, L' + R]: a real row sees its
slot's committed columns [0, c_i) and its own new rows (causally for unread/pending rows,
ancestors for candidates); a padding row sees only its own column.  Each call's rows land at
columns L' .. L' + rows - 1 of its batch row.  When most open slots are in the calls the
forward runs over the whole cache in place (B' = every open slot; an idle slot's row is all
padding and its KV, provisional rows included, is untouched: the forward only appends
columns).  When few are (under SHARED_FORWARD_SHARE: a lone `SlotView.verify`, the engine's
one-by-one retry), it runs over a copy of just their rows cut to their longest committed prefix
(L' = that length), and the new columns are copied back into their batch rows.

Joining.  A call with `unread` rows (a new request's prompt) would pad every row of the shared
forward to the prompt's length, so each such call is evaluated in its own forward, over its
slot's row alone cut to its committed length: exactly the single backend's forward (the
causal default mask for a chain, its tree mask otherwise), then merged into the batch cache
(padding the common length when the slot outgrew it).  The unread rows are committed at once.
So a `verify_many` is one forward for all its decode calls plus one per call with unread rows.

Commit and leave.  `commit(slot, rows)` gathers the pending row and the accepted rows of the
slot's batch row to columns c_i .. (index_select, as `TransformersBackend.commit`), and sets
c_i; the cache is then cut to the longest valid row over all slots (a view: the next forward's
concatenation makes it compact), so the common length shrinks once every slot has settled.
`open()` appends a zero batch row; `close(slot)` drops the slot's batch row at once
(index_select on dim 0: its KV is freed) and its id may be reused, starting empty.

A draft model's steps.  `draft_many` runs a draft model's step for every request (each on its
slot) in the same shared forward: an extend (`Extend`, pending-style rows committed at once), a
tree's first verify (`VerifyCall`) and its next level (`GrowRound`: rows that see the slot's
provisional ancestors; after the forward they are moved next to the provisional rows, so row r
stays at column p_i + 1 + r for `commit`).  Only an extend longer than SHARED_EXTEND_ROWS (a
prompt) runs in a forward of its own.  A self-drafter's composed pass (layer skip, Kangaroo) is
this class with its own forward and the layers it keeps (`_model_call`, `_held_layers`,
`_wrap_cache`, `_unwrap_cache`: `backends/layer_skip_batch.py`).

Failure.  Every check (slots, rows, context) runs before the first forward; a forward that
raises (out of memory) leaves every tensor and every slot as they were (the cache tensors
are only replaced after success; a partial merge writes padding columns only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch

from draftwise.backends.base import BackendInfo, ContextOverflow, TokenWeights, check_grows, check_path
from draftwise.backends.row_padding import RowPadding
from draftwise.backends.batch import DraftCall, Extend, GrowRound, VerifyCall, check_calls
from draftwise.backends.transformers import (TorchLogits, TransformersBackend, _cache_kwarg, _is_chain, additive_mask,
                                             kv_row_bytes)
from draftwise.errors import BackendError
from draftwise.topology.compile import CompiledRound

# run in place over every batch row when at least this share of the open slots is called, else over
# copied rows (SmolLM2-135M, 8 slots of ~200 tokens, CPU: in place costs one full forward whatever is
# called, ~77 ms; copying 1/2/4/8 rows costs 37/40/66/98 ms)
SHARED_FORWARD_SHARE = 0.75
# a draft extend of more tokens than this (a prompt read in round 1) runs in a forward of its own,
# so that it does not pad every other request's row of the shared forward to its length
SHARED_EXTEND_ROWS = 16


@dataclass(frozen=True)
class _Grow:
    """A `GrowRound` on its slot, whose provisional pending row sits at column `start`: its rows
    see the slot's committed prefix, that pending row and their ancestors (provisional or new)."""

    slot: int
    round_: CompiledRound
    first_row: int
    start: int
    unread: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        return self.round_.n - self.first_row


Call = VerifyCall | _Grow


@dataclass
class _Slot:
    row: int  # batch row in the cache tensors
    committed: int = 0  # c_i: columns [0, c_i) are authoritative
    start: int = -1  # p_i: column of the provisional pending row (-1: nothing provisional)
    rows: int = 0  # k_i: provisional rows (pending + candidates)
    round_: CompiledRound | None = None
    track: bool = False  # keep hidden states (draft heads read the frontier's)
    rows_hidden: torch.Tensor | None = None  # [k_i, d] of the provisional rows (pending first)
    frontier: torch.Tensor | None = None  # [d] of committed column c_i - 1: it predicted the pending token

    @property
    def end(self) -> int:
        """One past the last column this slot needs."""
        return self.start + self.rows if self.rows else self.committed


def visible_rows(entries: Sequence[tuple[int, Call | None]], past: int, width: int) -> torch.Tensor:
    """[B', R, past + R] bool: what each query row of a forward may see.  `entries` gives, per
    batch row, the slot's committed length and its call (None: a row of padding only); the new
    rows of batch row j sit at columns past .. past + R - 1, left-aligned."""
    visible = torch.zeros((len(entries), width, past + width), dtype=torch.bool)
    diag = torch.arange(width)
    visible[:, diag, past + diag] = True  # every row sees itself: a padding row sees nothing else
    for j, (committed, call) in enumerate(entries):
        if call is None:
            continue
        if isinstance(call, _Grow):
            f, m, p = call.first_row, call.rows, call.start
            ancestors = torch.from_numpy(call.round_.ancestor_mask[f:])  # [M, N]: self and ancestors
            visible[j, :m, :committed] = True
            visible[j, :m, p] = True  # the provisional pending row
            visible[j, :m, p + 1 : p + 1 + f] = ancestors[:, :f]  # provisional candidate rows
            visible[j, :m, past : past + m] = ancestors[:, f:]  # this level's rows
            continue
        rows, head = call.rows, len(call.unread) + 1  # head: unread rows and the pending one
        visible[j, :rows, :committed] = True
        visible[j, :head, past : past + head] = torch.ones((head, head), dtype=torch.bool).tril()
        if call.round_ is not None and call.round_.n:
            visible[j, head:rows, past : past + head] = True
            visible[j, head:rows, past + head : past + rows] = torch.from_numpy(call.round_.ancestor_mask)
    return visible


class TransformersBatch:
    """`BatchBackend` over one `TransformersBackend`'s loaded model (weights and tokenizer shared)."""

    def __init__(self, backend: TransformersBackend, max_slots: int = 8) -> None:
        from transformers import DynamicCache

        if max_slots < 1:
            raise BackendError(f"a batch holds at least 1 slot, not {max_slots}")
        self.backend = backend  # a self-draft pass composes its model for each request (backends/layer_skip.py)
        self.model = backend.model
        self.info: BackendInfo = backend.info
        self.device = torch.device(self.info.device)
        self._max_slots = max_slots
        self._cache_kwarg = _cache_kwarg(self.model)
        config = self.model.config
        probe = DynamicCache(config=config)
        if any(getattr(layer, "is_sliding", False) for layer in probe.layers):
            raise BackendError("batched decoding on transformers needs full-attention caches (no sliding windows)")
        self._layers = self._held_layers()
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._shape = (int(heads), int(head_dim))
        self._row_bytes = self.info.kv_row_bytes or kv_row_bytes(config, self.model.dtype)
        with torch.inference_mode():
            empty = torch.zeros((0, self._shape[0], 0, self._shape[1]), dtype=self.model.dtype, device=self.device)
        self._keys: list[torch.Tensor] = [empty] * self._layers  # [B, H, L, D] per layer
        self._values: list[torch.Tensor] = [empty] * self._layers
        self._slots: dict[int, _Slot] = {}

    @classmethod
    def from_backend(cls, backend: TransformersBackend, max_slots: int = 8) -> "TransformersBatch":
        batch = cls(backend, max_slots)
        batch.lone_padding = backend.row_padding
        return batch

    # Row padding (backends/row_padding.py) is the single backend's: its plan prices a forward's
    # products alone, and in a batch every padding row also attends over its slot's context and
    # widens every slot's cache; padded by it, plain batched decoding ran 0.95x and the batch-aware
    # gate 0.80x at B = 2 (benchmarks/row_padding/).  A batch pads only when given a plan of its own.
    row_padding: RowPadding | None = None
    # ...except a forward over ONE sequence (B = 1, or the last request of a batch): that is the
    # single backend's forward, product for product, so its plan holds there (unpadded, the batch
    # engine at B = 1 ran speculation slower than the single-request engine: benchmarks/batch_throughput/).
    lone_padding: RowPadding | None = None

    # ---- the forward (a composed draft pass overrides these: backends/layer_skip_batch.py) ----
    # a lone chain over a row cut to its committed length may leave the mask to the model's causal default
    causal_default = True

    def _held_layers(self) -> int:
        """How many layers' K and V the cache tensors hold."""
        return int(self.model.config.num_hidden_layers)

    def _wrap_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
        return _wrap(keys, values)

    def _unwrap_cache(self, cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return _unwrap(cache)

    def _model_call(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: Any,
                    keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions [B', R], mask [B', 1, R, K] or None -> (logits [B', keep, V] of the last
        `keep` rows, the last layer's hidden states [B', R, d] where `hidden`); appends to `cache`."""
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         **{self._cache_kwarg: cache}, logits_to_keep=keep, output_hidden_states=hidden)
        return out.logits, (out.hidden_states[-1] if hidden else None)

    # ---- slots ---------------------------------------------------------------------------
    @property
    def max_slots(self) -> int:
        return self._max_slots

    @property
    def n_threads(self) -> int:
        return torch.get_num_threads()

    @property
    def length(self) -> int:
        """L: the columns every batch row holds."""
        return int(self._keys[0].shape[2])

    def open(self) -> int:
        if len(self._slots) >= self._max_slots:
            raise BackendError(f"all {self._max_slots} slots are open")
        slot = min(set(range(self._max_slots)) - set(self._slots))
        with torch.inference_mode():
            zero = torch.zeros((1, self._shape[0], self.length, self._shape[1]), dtype=self.model.dtype,
                               device=self.device)
            keys = [torch.cat([k, zero]) for k in self._keys]
            values = [torch.cat([v, zero]) for v in self._values]
        self._keys, self._values = keys, values
        self._slots[slot] = _Slot(row=len(self._slots))
        return slot

    def close(self, slot: int) -> None:
        gone = self._slot(slot)
        keep = [s.row for s in sorted(self._slots.values(), key=lambda s: s.row) if s is not gone]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            keys = [k.index_select(0, index) for k in self._keys]
            values = [v.index_select(0, index) for v in self._values]
        self._keys, self._values = keys, values
        del self._slots[slot]
        for other in self._slots.values():
            if other.row > gone.row:
                other.row -= 1
        self._settle()

    def open_slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._slots))

    def cached_len(self, slot: int) -> int:
        return self._slot(slot).committed

    def reserve(self, slot: int, tree_rows: int) -> None:
        self._slot(slot)  # a tree is a mask over the slot's row: nothing to size per branch

    def reset(self, slot: int) -> None:
        state = self._slot(slot)
        state.committed, state.start, state.rows, state.round_ = 0, -1, 0, None
        state.rows_hidden = state.frontier = None
        self._settle()

    def _slot(self, slot: int) -> _Slot:
        state = self._slots.get(slot)
        if state is None:
            raise BackendError(f"slot {slot} is not open")
        return state

    def _settle(self) -> None:
        """Cut every row to the longest one a slot still needs (a view; the next forward compacts)."""
        need = max((s.end for s in self._slots.values()), default=0)
        if need < self.length:
            self._keys = [k[:, :, :need] for k in self._keys]
            self._values = [v[:, :, :need] for v in self._values]

    # ---- verify --------------------------------------------------------------------------
    def verify_many(self, calls: Sequence[VerifyCall]) -> list[TorchLogits]:
        check_calls(calls, self.open_slots(), self.info.max_verify_rows)
        self._check_settled(calls)
        decode = [i for i, call in enumerate(calls) if not call.unread]
        return self._run(list(calls), ([decode] if decode else []) + [[i] for i, call in enumerate(calls) if call.unread])

    def draft_many(self, calls: Sequence[DraftCall]) -> list[TorchLogits]:
        """A draft model's step for many requests (`backends.batch.DraftBatch`): every call in ONE
        forward, but an extend longer than SHARED_EXTEND_ROWS (a prompt) in one of its own;
        extends are committed."""
        check_calls([c for c in calls if isinstance(c, VerifyCall)], self.open_slots(), self.info.max_verify_rows)
        if len({c.slot for c in calls}) < len(calls):
            raise BackendError("a slot appears twice in one forward")
        internal: list[Call] = [self._grow(c) if isinstance(c, GrowRound) else
                                VerifyCall(c.slot, c.tokens[-1], None, c.tokens[:-1]) if isinstance(c, Extend) else c
                                for c in calls]
        self._check_settled([c for c in internal if isinstance(c, VerifyCall)])
        long = [i for i, c in enumerate(calls) if isinstance(c, Extend) and len(c.tokens) > SHARED_EXTEND_ROWS]
        short = [i for i in range(len(calls)) if i not in long]
        extends = [c.slot for c in calls if isinstance(c, Extend)]
        return self._run(internal, ([short] if short else []) + [[i] for i in long], commit=extends)

    def _grow(self, call: GrowRound) -> _Grow:
        state = self._slot(call.slot)
        check_grows(state.round_, state.rows, state.committed + 1, call.round_, call.first_row)
        if 1 + call.round_.n > self.info.max_verify_rows:
            raise BackendError(f"round of {1 + call.round_.n} rows exceeds this backend's limit of "
                               f"{self.info.max_verify_rows}")
        if state.end + call.round_.n - call.first_row > self.info.context_length:
            raise ContextOverflow(f"slot {call.slot}: {state.end} cached + {call.round_.n - call.first_row} new rows "
                                  f"exceed the context of {self.info.context_length}")
        return _Grow(call.slot, call.round_, call.first_row, state.start)

    def _check_settled(self, calls: Sequence[VerifyCall]) -> None:
        for call in calls:
            state = self._slots[call.slot]
            if state.rows:
                raise BackendError(f"slot {call.slot}: verify while a previous verify is provisional; "
                                   "commit or roll back first")
            if state.committed + call.rows > self.info.context_length:
                raise ContextOverflow(f"slot {call.slot}: {state.committed} cached + {call.rows} new rows exceed "
                                      f"the context of {self.info.context_length}")

    def _run(self, calls: list[Call], groups: list[list[int]], commit: Sequence[int] = ()) -> list[TorchLogits]:
        """One forward per group of calls, then `commit` (slots whose rows are committed at once);
        all or nothing: a failure restores every tensor and slot."""
        out: list[TorchLogits | None] = [None] * len(calls)
        before = (self._keys, self._values, {s: replace(state) for s, state in self._slots.items()})
        try:
            for group in groups:
                group_calls = [calls[i] for i in group]
                # a lone prompt is read over its own row: exactly the single backend's forward
                shared = (len(group_calls) >= SHARED_FORWARD_SHARE * len(self._slots)
                          and (len(group_calls) > 1 or not group_calls[0].unread))
                for i, logits in zip(group, self._forward(group_calls, shared)):
                    out[i] = logits
            for slot in commit:
                self.commit(slot, [])
        except BaseException:
            self._keys, self._values, self._slots = before
            raise
        return [logits for logits in out if logits is not None]

    def _forward(self, calls: list[Call], shared: bool) -> list[TorchLogits]:
        """One forward over `calls` (distinct slots, none provisional but a growing tree's): in place
        over every batch row when `shared`, else over a copy of the calls' rows; the slots' state is
        updated (rows read as context moved right after the slot's committed ones, a tree's next
        level right after its provisional rows)."""
        states = [self._slots[call.slot] for call in calls]
        if shared:
            call_of = {call.slot: call for call in calls}
            by_row = sorted(self._slots.items(), key=lambda item: item[1].row)  # batch row j is entry j
            entries = [(state.committed, call_of.get(slot)) for slot, state in by_row]
            past = self.length
            keys, values = self._keys, self._values
        else:
            entries = [(s.committed, call) for s, call in zip(states, calls)]
            past = max(s.end for s in states)  # a growing tree's provisional rows are kept
            index = torch.tensor([s.row for s in states], dtype=torch.long, device=self.device)
            with torch.inference_mode():
                keys = [k[:, :, :past].index_select(0, index) for k in self._keys]
                values = [v[:, :, :past].index_select(0, index) for v in self._values]
        first = min(len(call.unread) for call in calls)  # logits of rows [first, R) are kept
        width = max(call.rows for call in calls)
        padding = self.row_padding if self.row_padding is not None else \
            self.lone_padding if len(entries) == 1 else None
        if padding is not None and first == 0:  # every row read out (no prompt): the LM head's product is B' x R
            width = padding.width_for(len(entries), width)  # columns past every call's rows are padding rows
        batch_row = {call.slot: j for j, (_, call) in enumerate(entries) if call is not None}
        ids = torch.zeros((len(entries), width), dtype=torch.long)
        positions = torch.zeros((len(entries), width), dtype=torch.long)
        for j, (committed, call) in enumerate(entries):
            if call is None:
                continue
            ids[j, : call.rows] = torch.tensor(_row_tokens(call))
            positions[j, : call.rows] = torch.from_numpy(_row_positions(committed, call))
        plain = self.causal_default and len(entries) == 1 and entries[0][0] == past and _is_plain(calls[0])
        mask = None if plain else self._additive(visible_rows(entries, past, width))
        cache = self._wrap_cache(keys, values)
        hidden = any(state.track for state in states)
        with torch.inference_mode():
            out_logits, out_hidden = self._model_call(ids.to(self.device), positions.to(self.device), mask, cache,
                                                      width - first, hidden)
            new_keys, new_values = self._unwrap_cache(cache)
            if any(k.shape[2] != past + width for k in new_keys):
                raise BackendError("the model did not append one KV column per row to every layer")
            if shared:
                self._keys, self._values = new_keys, new_values
            else:
                self._merge(states, new_keys, new_values, past + width)
        logits = []
        for call, state in zip(calls, states):
            if isinstance(call, _Grow):
                logits.append(TorchLogits(out_logits[batch_row[call.slot], : call.rows]))  # first = 0: no unread
                self._place(call, state, past, out_hidden[batch_row[call.slot], : call.rows]
                            if out_hidden is not None and state.track else None)
                continue
            u, n = len(call.unread), call.rows - len(call.unread)
            self._move(state.row, past, state.committed, u)  # the unread rows are context: committed, whatever
            state.committed += u  # the round's outcome, so they go right after the committed prefix
            state.start, state.rows, state.round_ = past + u, n, call.round_
            j = batch_row[call.slot]
            state.rows_hidden = out_hidden[j, u : u + n] if out_hidden is not None and state.track else None  # [n, d]
            logits.append(TorchLogits(out_logits[j, u - first : u - first + n]))
        return logits

    def _place(self, call: _Grow, state: _Slot, past: int, hidden: torch.Tensor | None) -> None:
        """A tree level's new columns [past, past + M) moved next to the slot's provisional rows."""
        self._move(state.row, past, state.start + state.rows, call.rows)
        state.rows, state.round_ = state.rows + call.rows, call.round_
        if state.rows_hidden is not None and hidden is not None:
            state.rows_hidden = torch.cat([state.rows_hidden, hidden])

    def _move(self, row: int, source: int, to: int, count: int) -> None:
        """Columns [source, source + count) of batch row `row` moved to [to, to + count)."""
        if count and source != to:
            with torch.inference_mode():
                for tensor in self._keys + self._values:
                    tensor[row, :, to : to + count] = tensor[row, :, source : source + count].clone()

    def _merge(self, states: list[_Slot], keys: list[torch.Tensor], values: list[torch.Tensor], end: int) -> None:
        """Copy the columns from each slot's committed length on of a forward over copied rows
        into the slots' batch rows (growing every row to `end` columns when needed)."""
        grow = end - self.length
        if grow > 0:
            pad = torch.zeros((len(self._slots), self._shape[0], grow, self._shape[1]), dtype=self.model.dtype,
                              device=self.device)
            self._keys = [torch.cat([k, pad], dim=2) for k in self._keys]
            self._values = [torch.cat([v, pad], dim=2) for v in self._values]
        for j, state in enumerate(states):
            c = state.committed
            for big, small in zip(self._keys + self._values, keys + values):
                big[state.row, :, c:end] = small[j, :, c:end]

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """[B', Q, K] bool -> additive mask [B', 1, Q, K] in the model's dtype."""
        return additive_mask(visible, self.model.dtype, self.device)[:, None]

    # ---- settle --------------------------------------------------------------------------
    def commit(self, slot: int, accepted_rows: Sequence[int]) -> None:
        state = self._slot(slot)
        if not state.rows:
            raise BackendError(f"slot {slot}: commit() without a provisional verify")
        check_path(state.round_, accepted_rows)
        c, p = state.committed, state.start
        src = [p] + [p + 1 + int(r) for r in accepted_rows]
        if src != list(range(c, c + len(src))):
            index = torch.tensor(src, dtype=torch.long, device=self.device)
            with torch.inference_mode():
                for tensor in self._keys + self._values:
                    row = tensor[state.row]  # [H, L, D]
                    row[:, c : c + len(src)] = row.index_select(1, index)
        state.committed, state.start, state.rows, state.round_ = c + len(src), -1, 0, None
        if state.rows_hidden is not None:  # the last kept row predicted the new pending token
            state.frontier = state.rows_hidden[int(accepted_rows[-1]) + 1 if accepted_rows else 0]
            state.rows_hidden = None
        self._settle()

    def rollback(self, slot: int) -> None:
        state = self._slot(slot)
        state.start, state.rows, state.round_, state.rows_hidden = -1, 0, None, None
        self._settle()

    def truncate(self, slot: int, length: int) -> None:
        state = self._slot(slot)
        state.start, state.rows, state.round_, state.rows_hidden = -1, 0, None, None
        if length < state.committed:
            state.frontier = None  # the row that predicted the new pending token is no longer known
        state.committed = min(state.committed, max(0, int(length)))
        self._settle()

    # ---- hidden states (draft heads, per slot) -------------------------------------------
    def track_hidden(self, slot: int, on: bool = True) -> None:
        self._slot(slot).track = on

    def frontier_hidden(self, slot: int) -> np.ndarray | None:
        frontier = self._slot(slot).frontier
        return None if frontier is None else frontier.float().cpu().numpy()

    def token_weights(self) -> TokenWeights:
        return self.backend.token_weights()

    def kv_bytes(self, slot: int | None = None) -> int:
        if slot is not None:
            state = self._slot(slot)
            return (state.committed + state.rows) * self._row_bytes
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self._keys + self._values}
        return sum(storages.values()) if self._slots else 0

    # ---- text ----------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.backend.tokenize(text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.backend.detokenize(tokens)

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.backend.chat_prompt(messages)


def _wrap(keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
    """A DynamicCache over these tensors (no copy: the forward's concatenation makes new ones)."""
    from transformers import DynamicCache

    cache: Any = DynamicCache(ddp_cache_data=[(k[:, :, :0], v[:, :, :0]) for k, v in zip(keys, values)])
    for layer, k, v in zip(cache.layers, keys, values):
        layer.keys, layer.values = k, v
    return cache


def _unwrap(cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's K and V after a forward (refused unless every layer holds them)."""
    keys, values = [], []
    for layer in cache.layers:
        if not (isinstance(layer.keys, torch.Tensor) and isinstance(layer.values, torch.Tensor)):
            raise BackendError("a layer of the model kept no KV rows: batched decoding needs every layer's")
        keys.append(layer.keys)
        values.append(layer.values)
    return keys, values


def _row_tokens(call: Call) -> list[int]:
    if isinstance(call, _Grow):
        return [int(t) for t in call.round_.token_ids[call.first_row :]]
    return [int(x) for x in call.unread] + [int(call.pending)] + \
        ([] if call.round_ is None else call.round_.token_ids.tolist())


def _row_positions(committed: int, call: Call) -> np.ndarray:
    """Positions of a call's rows, as `TransformersBackend.verify` (and `verify_more`) gives them."""
    if isinstance(call, _Grow):
        return call.round_.position_ids[call.first_row :].astype(np.int64)
    t = committed + len(call.unread)  # the pending token's position
    if _is_plain(call):
        return np.arange(committed, committed + call.rows, dtype=np.int64)
    assert call.round_ is not None
    return np.concatenate([np.arange(committed, t + 1, dtype=np.int64), call.round_.position_ids.astype(np.int64)])


def _is_plain(call: Call) -> bool:
    """Rows in a line (pending only, or a chain): the causal order is the tree's."""
    return not isinstance(call, _Grow) and (call.round_ is None or _is_chain(call.round_))
