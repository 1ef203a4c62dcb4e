"""Sequences on one loaded transformers model (slots in the batch rows of one KV cache), and the
logits its forwards return (`TorchLogits`).

Every transformers backend runs here: a batch of requests, and a lone sequence (a
`TransformersBackend` is a view of a one-slot instance).  Slot i's committed rows are columns
[0, c_i) of its batch row, its provisional rows (after a verify) columns [p_i, p_i + k_i); every
other column of the row is padding, hidden by the row's additive mask (padding is always finite,
so a masked column weighs exactly 0 and never turns a row into NaN).

A forward takes input_ids and position ids [B', R] (shorter calls padded) and a mask
[B', 1, R, L' + R]; each call's rows land at columns L'.. of its batch row.  It runs in place
over every batch row when most open slots are called (or one is open), else over a copy of just
the called rows, merged back.  A call with unread rows (a prompt) gets a forward of its own, so
that it pads no other row.  A forward over one sequence is the lone backend's forward: the
model's causal default for a chain, padded by the row-padding plan (`backends/row_padding.py`).
`commit` gathers the pending and accepted rows next to the committed ones; the cache is cut to
the longest row a slot still needs.  A draft model's steps (`draft_many`: extends, a tree's
levels) share the same forwards.  A forward that raises leaves every tensor and slot as it was.
"""

from __future__ import annotations

import inspect
from copy import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from draftwise.backends.base import BackendInfo, ContextOverflow, TokenWeights, check_grows, check_path
from draftwise.backends.batch import DraftCall, Extend, GrowRound, VerifyCall, check_calls
from draftwise.backends.row_padding import RowPadding
from draftwise.backends.torch_probs import policy_probs
from draftwise.errors import BackendError
from draftwise.runtime.logits import cached
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.text import check_messages, check_utf8
from draftwise.topology.compile import CompiledRound

# run in place over every batch row when at least this share of the open slots is called, else over
# copied rows (the trade-off is measured in benchmarks/batch_throughput/)
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
    pending: int = -1  # the provisional pending token
    tokens: list[int] = field(default_factory=list)  # the committed tokens
    generation: int = 0  # bumped whenever committed rows are dropped or cut
    track: bool = False  # keep hidden states (draft heads read the frontier's)
    rows_hidden: torch.Tensor | None = None  # [k_i, d] of the provisional rows (pending first)
    frontier: torch.Tensor | None = None  # [d] of committed column c_i - 1: it predicted the pending token
    keeps_context: bool = False  # keep every committed row's state (a layer over the context reads them)
    context: _GrowingRows | None = None  # [c_i, d] the committed rows' states; None: unknown

    @property
    def end(self) -> int:
        """One past the last column this slot needs."""
        return self.start + self.rows if self.rows else self.committed


@dataclass(frozen=True, eq=False)
class TorchLogits:
    """TargetLogits over a device tensor [1 + N, V].

    On an accelerator the first `probs` call applies the policy to every row in one batched
    pass on the device and copies the result to the host once; later rows are host slices, so
    a walk costs one sync instead of one per node.  On the CPU there is no sync to save and a
    walk visits few rows, so each row goes through the NumPy reference (`SamplingPolicy.probs`,
    on a zero-copy view) when first asked for.  `on_device` forces the choice (tests run the
    batched torch pass on the CPU)."""

    logits: torch.Tensor
    on_device: bool | None = None  # None: batched torch pass on accelerators, NumPy rows on the CPU
    _cache: dict[Any, np.ndarray] = field(default_factory=dict, init=False, repr=False)  # policy or (policy, row) -> host array

    def argmax(self) -> np.ndarray:
        return self.logits.argmax(dim=-1).cpu().numpy()

    def probs(self, row: int, policy: SamplingPolicy) -> np.ndarray:
        if self._batched:
            probs: np.ndarray = self.probs_all(policy)[row]  # [V]
        else:
            probs = cached(self._cache, (policy, row), lambda: policy.probs(self._host(row)))  # [V]
        return probs

    def probs_all(self, policy: SamplingPolicy) -> np.ndarray:
        """[1 + N, V] float64 on the host: one batched pass (on the device when batched), one copy."""
        if not self._batched:
            return policy.probs(self._host())
        return cached(self._cache, policy, lambda: self._on_device(policy).cpu().numpy())

    @property
    def _batched(self) -> bool:
        return self.logits.device.type != "cpu" if self.on_device is None else self.on_device

    def _host(self, rows: int | slice = slice(None)) -> np.ndarray:
        """Host view of `rows` ([V] or [R, V]); float32 and float64 as they are, half precisions
        widened to float32 as before (only the rows asked for)."""
        logits = self.logits[rows]
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        return logits.detach().cpu().numpy()

    def _on_device(self, policy: SamplingPolicy) -> torch.Tensor:
        with torch.inference_mode():
            return policy_probs(self.logits, policy)  # [1 + N, V] float64, on the logits' device


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Bool visibility [..., Q, K] -> the additive attention mask of the same shape in `dtype`
    (0 where a row sees a column, the dtype's minimum where it does not), on `device`."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask.to(device)


def kv_shape(config: Any) -> tuple[int, int]:
    """(kv heads, head dim) of one layer's K (and V) row."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return int(heads), int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _cache_kwarg(model: Any) -> str:
    """The forward argument that takes the KV cache: transformers renamed `past_key_values` to
    `cache` (the old name warns, and goes in 5.40); older 5.x releases know only the old one."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def sliding_window(config: Any) -> int | None:
    """The narrowest attention window of the model's cache layers (None: every layer sees the whole context)."""
    from transformers import DynamicCache

    layers: list[Any] = list(DynamicCache(config=config).layers)
    windows = [int(layer.sliding_window) for layer in layers if getattr(layer, "is_sliding", False)]
    return min(windows) if windows else None


def _is_chain(round_: CompiledRound) -> bool:
    return bool(np.array_equal(round_.parent, np.arange(-1, round_.n - 1)))


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
    """`BatchBackend` and `DraftBatch` on `backend`'s loaded model (its model, tokenizer and info)."""

    # The batch's own row padding, for forwards over several sequences (None: unpadded; the model's
    # plan prices a forward's products alone, while in a batch every padding row also attends over
    # its slot's context and widens every slot's cache: benchmarks/row_padding/).
    row_padding: RowPadding | None = None
    # The model's plan (`TransformersBackend.row_padding`), for a forward over ONE sequence: that is
    # the lone backend's forward, product for product (benchmarks/batch_throughput/).
    lone_padding: RowPadding | None = None
    causal_default = True  # the forward builds a causal mask of its own where given none

    def __init__(self, backend: Any, max_slots: int = 8) -> None:
        if max_slots < 1:
            raise BackendError(f"a batch holds at least 1 slot, not {max_slots}")
        self.model, self.tokenizer = backend.model, backend.tokenizer
        self.info: BackendInfo = backend.info
        self.device = torch.device(self.info.device)
        self._max_slots = max_slots
        self._cache_kwarg = _cache_kwarg(self.model)
        config = self.model.config
        window = sliding_window(config)
        if window is not None and window < self.info.context_length:
            raise BackendError(f"the KV cache holds every column, but this model attends over a window of {window} "
                               f"tokens in a context of {self.info.context_length}")
        self._layers = self._held_layers()
        self._shape = kv_shape(config)
        with torch.inference_mode():
            empty = torch.zeros((0, self._shape[0], 0, self._shape[1]), dtype=self.model.dtype, device=self.device)
        self._row_bytes = 2 * self._layers * self._shape[0] * self._shape[1] * empty.element_size()
        self._keys: list[torch.Tensor] = [empty] * self._layers  # [B, H, L, D] per layer
        self.length = 0  # L: the columns every batch row holds (a pass may hold no layer's)
        self._values: list[torch.Tensor] = [empty] * self._layers
        self._slots: dict[int, _Slot] = {}
        self._cache: Any = None  # the DynamicCache the forwards see (`_wrap_cache`)

    @classmethod
    def from_backend(cls, backend: Any, max_slots: int = 8) -> "TransformersBatch":
        """A batch on a `TransformersBackend`'s model, its one-sequence forwards padded by its plan."""
        batch = cls(backend, max_slots)
        batch.lone_padding = backend.row_padding
        return batch

    # ---- the forward (a composed draft pass overrides these: backends/layer_skip_batch.py) ----
    def _held_layers(self) -> int:
        """How many layers' K and V the cache tensors hold."""
        return int(self.model.config.num_hidden_layers)

    def _wrap_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
        """A DynamicCache over these tensors (no copy: the forward's concatenation makes new ones),
        built once (building one costs a sizable share of a small model's step) and re-pointed."""
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache(ddp_cache_data=[(k[:, :, :0], v[:, :, :0]) for k, v in zip(keys, values)])
        for layer, k, v in zip(self._cache.layers, keys, values):
            layer.keys, layer.values = k, v
        return self._cache

    def _unwrap_cache(self, cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's K and V after a forward (refused unless every layer holds them)."""
        if not all(isinstance(layer.keys, torch.Tensor) and isinstance(layer.values, torch.Tensor)
                   for layer in cache.layers):
            raise BackendError("a layer of the model kept no KV rows: batched decoding needs every layer's")
        return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]

    def _model_call(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: Any,
                    keep: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions [B', R], mask [B', 1, R, K] or None -> (logits [B', keep, V] of the last
        `keep` rows, the last layer's hidden states [B', R, d] where `hidden`); appends to `cache`."""
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         **{self._cache_kwarg: cache}, logits_to_keep=keep, output_hidden_states=hidden)
        # the last entry is the final norm's output, the LM head's input (checked by a test)
        return out.logits, (out.hidden_states[-1] if hidden else None)

    # ---- slots ---------------------------------------------------------------------------
    @property
    def max_slots(self) -> int:
        return self._max_slots

    @property
    def n_threads(self) -> int:
        # torch's intra-op pool is per process (load_backend sets it from --threads), so read it live
        return torch.get_num_threads()

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

    def committed_tokens(self, slot: int) -> list[int]:
        return list(self._slot(slot).tokens)

    def generation(self, slot: int) -> int:
        """Bumped whenever the slot's committed rows are dropped or cut (a reset, a truncate)."""
        return self._slot(slot).generation

    def reserve(self, slot: int, tree_rows: int) -> None:
        self._slot(slot)  # a tree is a mask over the slot's row: nothing to size per branch

    def reset(self, slot: int) -> None:
        state = self._slot(slot)
        self._drop_provisional(state)
        state.committed, state.tokens, state.frontier, state.generation = 0, [], None, state.generation + 1
        state.context = _GrowingRows(self.model.config.hidden_size, self.model.dtype, self.device) \
            if state.keeps_context else None
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
            self.length = need

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
        if any(isinstance(c, Extend) and not c.tokens for c in calls):
            raise BackendError("extend() needs at least one token")
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
        before = (self._keys, self._values, self.length, {s: copy(state) for s, state in self._slots.items()})
        told = {s: len(state.tokens) for s, state in self._slots.items()}  # a forward only appends tokens
        try:
            for group in groups:
                group_calls = [calls[i] for i in group]
                # a lone prompt beside other slots is read over its own row, so that it pads none of theirs
                shared = len(self._slots) == 1 or (len(group_calls) >= SHARED_FORWARD_SHARE * len(self._slots)
                                                   and (len(group_calls) > 1 or not group_calls[0].unread))
                for i, logits in zip(group, self._forward(group_calls, shared)):
                    out[i] = logits
            for slot in commit:
                self.commit(slot, [])
        except BaseException:
            self._keys, self._values, self.length, self._slots = before
            self._cache = None  # a forward that failed part way may have left rows in its layers
            for slot, state in self._slots.items():  # what the undone forwards appended
                del state.tokens[told[slot]:]
                if state.context is not None:
                    state.context.crop(state.committed)
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
        if first == 0:  # every row read out (no prompt): the LM head's product is B' x R
            width = self._padded_width(len(entries), width, past)  # columns past every call's rows are padding
        batch_row = {call.slot: j for j, (_, call) in enumerate(entries) if call is not None}
        ids = torch.zeros((len(entries), width), dtype=torch.long)
        positions = torch.zeros((len(entries), width), dtype=torch.long)
        for j, (committed, call) in enumerate(entries):
            if call is None:
                continue
            ids[j, : call.rows] = torch.tensor(_row_tokens(call))
            positions[j, : call.rows] = torch.from_numpy(_row_positions(committed, call))
        # a lone chain over a row cut to its committed length: the model's causal default (a composed
        # pass has none, but one row sees every column)
        plain = len(entries) == 1 and entries[0][0] == past and _is_plain(calls[0]) and \
            (self.causal_default or width == 1)
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
                self._keys, self._values, self.length = new_keys, new_values, past + width
            else:
                self._merge(states, new_keys, new_values, past + width)
        logits = []
        for call, state in zip(calls, states):
            j = batch_row[call.slot]
            rows_hidden = out_hidden[j] if out_hidden is not None and state.track else None  # [R, d]
            if isinstance(call, _Grow):
                logits.append(TorchLogits(out_logits[j, : call.rows]))  # first = 0: no unread
                self._place(call, state, past, None if rows_hidden is None else rows_hidden[: call.rows])
                continue
            u, n = len(call.unread), call.rows - len(call.unread)
            self._move(state.row, past, state.committed, u)  # the unread rows are context: committed, whatever
            state.committed += u  # the round's outcome, so they go right after the committed prefix
            state.tokens.extend(call.unread)
            if u:
                self._keep_context(state, None if rows_hidden is None else rows_hidden[:u])
            state.start, state.rows, state.round_, state.pending = past + u, n, call.round_, call.pending
            state.rows_hidden = None if rows_hidden is None else rows_hidden[u : u + n]  # [n, d]
            logits.append(TorchLogits(out_logits[j, u - first : u - first + n]))
        self._settle()  # the padding rows' columns: no later row may see them
        return logits

    def _padded_width(self, sequences: int, width: int, past: int) -> int:
        """The width a forward of `sequences` rows of `width` (every row read out) runs as: by the
        batch's own plan, else by the model's over one sequence; unpadded past the context."""
        padding = self.row_padding if self.row_padding is not None else \
            self.lone_padding if sequences == 1 else None
        if padding is None:
            return width
        padded = padding.width_for(sequences, width)
        return padded if past + padded <= self.info.context_length else width

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
            self.length = end
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
        c, p, round_ = state.committed, state.start, state.round_
        src = [p] + [p + 1 + int(r) for r in accepted_rows]
        if src != list(range(c, c + len(src))):
            index = torch.tensor(src, dtype=torch.long, device=self.device)
            with torch.inference_mode():
                for tensor in self._keys + self._values:
                    row = tensor[state.row]  # [H, L, D]
                    row[:, c : c + len(src)] = row.index_select(1, index)
        state.tokens.append(state.pending)
        if round_ is not None:
            state.tokens.extend(int(round_.token_ids[r]) for r in accepted_rows)
        state.committed = c + len(src)
        rows = state.rows_hidden  # the last kept row predicted the new pending token
        state.frontier = None if rows is None else rows[int(accepted_rows[-1]) + 1 if accepted_rows else 0]
        self._keep_context(state, None if rows is None else rows[[0, *(int(r) + 1 for r in accepted_rows)]])
        self._drop_provisional(state)
        self._settle()

    def rollback(self, slot: int) -> None:
        self._drop_provisional(self._slot(slot))
        self._settle()

    def truncate(self, slot: int, length: int) -> None:
        state = self._slot(slot)
        self._drop_provisional(state)
        length = max(0, int(length))
        if length < state.committed:
            state.frontier = None  # the row that predicted the new pending token is no longer known
            state.generation += 1
            del state.tokens[length:]
            state.committed = length
            if state.context is not None:
                state.context.crop(length)
        self._settle()

    @staticmethod
    def _drop_provisional(state: _Slot) -> None:
        state.start, state.rows, state.round_, state.rows_hidden = -1, 0, None, None

    # ---- hidden states (draft heads, per slot) -------------------------------------------
    def track_hidden(self, slot: int, on: bool = True) -> None:
        self._slot(slot).track = on

    def frontier_hidden(self, slot: int) -> np.ndarray | None:
        frontier = self._slot(slot).frontier
        return None if frontier is None else frontier.float().cpu().numpy()

    def track_context(self, slot: int, on: bool = True) -> None:
        """Keep every committed row's state (`backends.base.ContextHidden`), from the next reset on."""
        state = self._slot(slot)
        state.keeps_context = on
        if on:
            state.track = True
        else:
            state.context = None

    def context_hidden(self, slot: int, start: int) -> np.ndarray | None:
        state = self._slot(slot)
        context = state.context
        if context is None or context.length != state.committed or not 0 <= start <= state.committed:
            return None
        return context.rows(start).to(torch.float32, copy=True).cpu().numpy()

    @staticmethod
    def _keep_context(state: _Slot, rows: torch.Tensor | None) -> None:
        """Append the states of rows just committed [R, d] (None: unknown, so is every later row)."""
        if state.context is not None:
            if rows is None:
                state.context = None
            else:
                state.context.append(rows)

    def token_weights(self) -> TokenWeights:
        embed = self.model.get_input_embeddings().weight.detach().float().cpu()
        head = self.model.get_output_embeddings().weight.detach().float().cpu()
        return TokenWeights(embed.numpy(), embed.numpy() if head.data_ptr() == embed.data_ptr() else head.numpy())

    def kv_bytes(self, slot: int | None = None) -> int:
        if slot is not None:
            state = self._slot(slot)
            return (state.committed + state.rows) * self._row_bytes
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self._keys + self._values}
        return sum(storages.values()) if self._slots else 0

    # ---- text ----------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        check_utf8(text)  # text that is not valid UTF-8 is refused by name (draftwise.runtime.text), as on llama.cpp
        return list(self.tokenizer(text, add_special_tokens=add_special).input_ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=False))

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        check_messages(messages)
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


class _GrowingRows:
    """Committed rows' hidden states [length, d], appended a round at a time into a buffer that
    doubles when full (a `torch.cat` per round would copy the whole context every round)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device, capacity: int = 16) -> None:
        with torch.inference_mode():  # written in place with the model's inference-mode outputs
            self._buffer = torch.zeros((capacity, width), dtype=dtype, device=device)  # [capacity, d]
        self.length = 0

    def append(self, rows: torch.Tensor) -> None:
        """Rows [R, d] after the last one."""
        end = self.length + rows.shape[0]
        with torch.inference_mode():
            if end > self._buffer.shape[0]:
                grown = self._buffer.new_zeros((max(end, 2 * self._buffer.shape[0]), self._buffer.shape[1]))
                grown[: self.length] = self._buffer[: self.length]
                self._buffer = grown
            self._buffer[self.length : end] = rows
        self.length = end

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def rows(self, start: int) -> torch.Tensor:
        """A view of rows [start, length) (overwritten by a later crop and append: copy to keep)."""
        return self._buffer[start : self.length]


def _row_tokens(call: Call) -> list[int]:
    if isinstance(call, _Grow):
        return [int(t) for t in call.round_.token_ids[call.first_row :]]
    return [int(x) for x in call.unread] + [int(call.pending)] + \
        ([] if call.round_ is None else call.round_.token_ids.tolist())


def _row_positions(committed: int, call: Call) -> np.ndarray:
    """Positions of a call's rows: in a line for unread rows, the pending one and a chain; a
    tree's rows at their depth."""
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
