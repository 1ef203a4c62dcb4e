"""Many requests in one llama.cpp forward: `LlamaCppBatch`, the `BatchBackend` of llama.cpp.

One context on the weights a `LlamaCppBackend` already loaded (llama.cpp contexts share a
model: the weights are read-only, each context has its own KV cache and buffers).  The
context's KV cache is unified and holds `max_slots * slot_ctx` cells, where `slot_ctx` is
each slot's own context window (`info.context_length`): every slot may fill its window at
once, so a decode never runs out of cells, and a slot that would pass its window is refused
with `ContextOverflow` naming it before anything is decoded.

KV layout.  With tree leaves (L > 0) the cache is unified: a candidate's cell joins the
sequences of several leaves, and every row's attention spans every slot's cells, masked.  A
batch of chains only (L = 0) keeps one KV stream per slot (`kv_unified = false`, `slot_ctx`
cells each): a row attends over its own slot's cells only, which is cheaper at B = 4-8 and
makes a slot's rows bit-identical to the same verify on a single-sequence backend wherever the
matrix kernels are row-invariant (measured on SmolLM2-135M Q4_1, default kernels, AMD EPYC:
max |difference| 0.0 at B = 2, 4, 8 for pending-only and 3- and 7-candidate chains, against
0.33-1.08 in the unified cache: `benchmarks/llamacpp_exactness/`).

Sequences: slot i owns ids [i * (L + 1), (i + 1) * (L + 1)), L = `max_tree_leaves`: its main
sequence (the committed text, what sequence 0 is to `LlamaCppBackend`) and one per tree leaf
(`n_seq_max = max_slots * (L + 1)`, at most llama.cpp's 256).  A row carries only its own
slot's ids, and llama.cpp lets a query see the cells of its (first) sequence at positions <=
its own, so no row ever attends to another slot's cells: `origin_request` is the mask.  Within
a slot everything is as in `LlamaCppBackend`: a chain (and a pending-only call) lives in the
main sequence, a tree round `seq_cp`s the main sequence into each leaf's and a candidate row
joins the sequences of the leaves below it; commit and rollback use per-sequence
`llama_memory_seq_rm` / `seq_cp` only (`seq_keep` would drop every other slot).

`verify_many` is ONE `llama_decode` of one `llama_batch` holding every call's rows (unread,
pending, candidates; logits on for pending and candidates), as long as they fit llama.cpp's
batch of 512 tokens (`n_batch` = `n_ubatch`).  When they do not, whole calls are packed into
several decodes of at most 512 rows each, and a call whose prompt (`unread`) alone makes it
longer than 512 rows reads that prompt first in decodes of its own (no logits).  A failed
decode leaves every slot as it was (prompt rows included).  The logits of the last decode
are zero-copy views (valid until the next `verify_many`), earlier decodes' are copies.

Exactness: llama.cpp's CPU kernels are not batch-invariant (`LlamaCppKernels`), so a slot's
row inside a shared batch can differ from the same row decoded alone by kernel rounding;
`probe_batch_invariance` measures it for B slots.  Measured on SmolLM2-135M (Q4 GGUF, default
kernels, 1 or 2 threads, prefixes of 40-89 tokens): against a single-sequence backend's verify, slot 0
alone (B = 1) is bit-identical; for B = 2, 4, 8 the rows differ by up to 0.31-0.83 (pending-only
and 3- and 7-candidate chains, 1.13 worst) - mostly because a slot's cells sit elsewhere in the
unified cache than a lone sequence's, since the same call verified alone on the batch context
(same cells) is bit-identical for most shapes and at most 0.80 away.  Strict kernels (a
graveyard sequence, throwaway pad rows) are single-sequence devices and are refused here.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Sequence

import llama_cpp
import numpy as np

from draftwise.backends.base import BackendError, BackendInfo, ContextOverflow
from draftwise.backends.batch import DraftCall, Extend, GrowRound, VerifyCall, check_calls
from draftwise.backends.llamacpp import (
    _N_BATCH,
    DEFAULT_KERNELS,
    LLAMACPP_MAX_SEQUENCES,
    LlamaCppBackend,
    LlamaCppKernels,
    _is_chain,
    _new_context,
    check_grows,
    plan_growth,
    seq_through,
    tree_membership,
)
from draftwise.backends.llamacpp_batch import NumpyBatch
from draftwise.runtime.logits import NumpyLogits
from draftwise.models import ResolvedModel
from draftwise.topology.compile import CompiledRound

_OWNED_BACKEND_CTX = 256  # cells of the context a `load`ed batch's own backend keeps (text only)


class _Context:
    """The batch's llama.cpp context, freed once: by the batch, or by the backend whose weights
    it uses when that backend is closed first (`_Handles.dependents`)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def free(self) -> None:
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None


def _release(handles, context: _Context, owned: LlamaCppBackend | None) -> None:
    context.free()
    if context in handles.dependents:
        handles.dependents.remove(context)
    if owned is not None:
        owned.close()


@dataclass
class _Slot:
    """One open slot's state (local sequence ids: 0 = its main sequence, 1 + i = leaf i)."""

    committed: int = 0
    pending_rows: int = 0  # provisional rows of the last verify (pending included)
    round_: CompiledRound | None = None
    seq_end: dict[int, int] = field(default_factory=dict)  # local sequence -> candidate row its path ends at


@dataclass
class _Planned:
    """One call of a verify_many, checked and laid out."""

    index: int  # into the calls
    call: VerifyCall
    start: int  # the slot's committed length before the call
    pre_read: bool  # its unread rows are decoded before (and apart from) the round's batch
    leaves: list[int]  # a tree's leaf rows ([] for pending-only and chains)
    tokens: np.ndarray  # [R] the rows this call adds to the round's batch
    positions: np.ndarray  # [R]
    member: np.ndarray  # [R, 1 + L] local sequences of each row
    outputs: np.ndarray  # [R] bool: logits wanted

    @property
    def rows(self) -> int:
        return len(self.tokens)


class LlamaCppBatch:
    """`BatchBackend` over one llama.cpp context (see the module docstring)."""

    def __init__(self, backend: LlamaCppBackend, max_slots: int, max_tree_leaves: int, slot_ctx: int,
                 owns_backend: bool = False) -> None:
        kernels = backend.kernels
        if kernels.min_rows > 1 or kernels.keep_rejected_cells:
            raise BackendError(f"strict kernels ({kernels.describe()}) are for one sequence: a shared batch's rows "
                               "are not plain decoding's anyway (see probe_batch_invariance); load the backend "
                               "with default kernels")
        if max_slots < 1:
            raise BackendError(f"a batch needs at least one slot, got {max_slots}")
        if max_tree_leaves < 0:
            raise BackendError(f"max_tree_leaves must be >= 0, got {max_tree_leaves}")
        if max_slots * (max_tree_leaves + 1) > LLAMACPP_MAX_SEQUENCES:
            raise BackendError(
                f"{max_slots} slots x ({max_tree_leaves} tree leaves + 1) need {max_slots * (max_tree_leaves + 1)} "
                f"sequences; a llama.cpp context holds at most {LLAMACPP_MAX_SEQUENCES} (fewer slots or leaves)")
        if slot_ctx < 2:
            raise BackendError(f"a slot's context must hold at least 2 tokens, got {slot_ctx}")
        self.backend = backend
        self._owns_backend = owns_backend
        self._max_slots = max_slots
        self.max_tree_leaves = max_tree_leaves
        self.slot_ctx = slot_ctx
        self.kernels: LlamaCppKernels = kernels
        self.geometry = backend.geometry
        self.info: BackendInfo = replace(backend.info, context_length=slot_ctx,
                                         max_verify_rows=min(backend.info.max_verify_rows, _N_BATCH),
                                         prompt_shares_round=True)  # `verify_many` decodes them together
        self._n_vocab = backend.info.vocab_size
        self._slots: dict[int, _Slot] = {}
        self._context = _Context(None)
        self._finalizer = None
        self._make_context()

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_backend(cls, backend: LlamaCppBackend, max_slots: int = 8, max_tree_leaves: int | None = None,
                     slot_ctx: int | None = None) -> "LlamaCppBatch":
        """A batch context on `backend`'s loaded weights (nothing is loaded again).  Each slot's
        window is `slot_ctx` (default: the backend's context length); the context holds
        `max_slots * slot_ctx` cells.  Trees of up to `max_tree_leaves` leaves (default: what the
        backend was reserved for).  Closing `backend` frees this context too."""
        leaves = backend.max_tree_leaves if max_tree_leaves is None else max_tree_leaves
        return cls(backend, max_slots, leaves, slot_ctx or backend.info.context_length)

    @classmethod
    def load(cls, model: ResolvedModel, n_threads: int | None = None, n_ctx: int = 4096, max_slots: int = 8,
             max_tree_leaves: int = 0, kernels: LlamaCppKernels = DEFAULT_KERNELS) -> "LlamaCppBatch":
        """Load the weights (as `LlamaCppBackend.load`, with a small context of its own kept for
        the text functions) and make a batch of `max_slots` slots of `n_ctx` tokens each."""
        backend = LlamaCppBackend.load(model, n_threads=n_threads, n_ctx=_OWNED_BACKEND_CTX, kernels=kernels)
        try:
            return cls(backend, max_slots, max_tree_leaves, n_ctx, owns_backend=True)
        except BaseException:
            backend.close()
            raise

    @property
    def unified(self) -> bool:
        """One KV cache for every slot (trees: a candidate's cell joins the sequences of several
        leaves), else one stream per slot (chains only: see the module docstring)."""
        return self.max_tree_leaves > 0

    def _make_context(self) -> None:
        handles = self.backend._handles
        if self._finalizer is not None:
            self._finalizer.detach()
            _release(handles, self._context, None)
        n_seq = self._max_slots * (self.max_tree_leaves + 1)
        ctx = _new_context(self.backend._model, self._max_slots * self.slot_ctx, n_seq, self.backend.n_threads,
                           self.backend._path, self.kernels, unified=self.unified)
        self._context = _Context(ctx)
        handles.dependents.append(self._context)
        self._finalizer = weakref.finalize(self, _release, handles, self._context,
                                           self.backend if self._owns_backend else None)
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._batch = NumpyBatch(_N_BATCH, n_seq)
        self.n_ctx_cells = int(llama_cpp.llama_n_ctx(ctx))

    def free(self) -> None:
        """Free the context now (and the weights, when `load` loaded them)."""
        self._finalizer()

    @property
    def _ctx(self):
        ctx = self._context.ctx
        if ctx is None:
            raise BackendError("this batch's llama.cpp context was freed (its backend was closed, or free() called)")
        return ctx

    # ---- slots -----------------------------------------------------------------------------
    @property
    def max_slots(self) -> int:
        return self._max_slots

    @property
    def n_threads(self) -> int:
        return self.backend.n_threads

    def open(self) -> int:
        self._ctx  # noqa: B018 - refuse on a freed context
        free = [s for s in range(self._max_slots) if s not in self._slots]
        if not free:
            raise BackendError(f"all {self._max_slots} slots are open")
        slot = free[0]
        self._slots[slot] = _Slot()
        return slot

    def close(self, slot: int) -> None:
        self._state(slot)
        self._clear(slot)
        del self._slots[slot]

    def open_slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._slots))

    def cached_len(self, slot: int) -> int:
        return self._state(slot).committed

    def reserve(self, slot: int, tree_rows: int) -> None:
        """Trees of up to `tree_rows` branching rows on `slot`.  The sequence budget is the
        context's (every slot has the same ids): within it nothing happens; beyond it the
        context is made again, which only an empty batch allows (no slot holds a cell)."""
        self._state(slot)
        leaves = min(tree_rows, LLAMACPP_MAX_SEQUENCES // self._max_slots - 1)
        if leaves <= self.max_tree_leaves:
            return
        if any(s.committed or s.pending_rows for s in self._slots.values()):
            raise BackendError(
                f"slot {slot}: trees of {tree_rows} rows need {leaves} leaf sequences per slot but this batch holds "
                f"{self.max_tree_leaves}, and a larger budget remakes the context, which only an empty batch allows "
                "(build it with a larger max_tree_leaves)")
        self.max_tree_leaves = leaves
        self._make_context()

    def reset(self, slot: int) -> None:
        self._state(slot)
        self._clear(slot)
        self._slots[slot] = _Slot()

    def _state(self, slot: int) -> _Slot:
        state = self._slots.get(slot)
        if state is None:
            raise BackendError(f"slot {slot} is not open")
        return state

    # ---- sequence ids ----------------------------------------------------------------------
    def seq_ids(self, slot: int) -> range:
        """The llama.cpp sequence ids slot `slot` owns (its main sequence first)."""
        base = self._seq_base(slot)
        return range(base, base + self.max_tree_leaves + 1)

    def _seq_base(self, slot: int) -> int:
        return slot * (self.max_tree_leaves + 1)

    def _clear(self, slot: int) -> None:
        """Every cell of the slot goes (its main and leaf sequences)."""
        for seq in self.seq_ids(slot):
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def _seq_rm(self, seq: int, start: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, start, -1):
            raise BackendError(f"llama.cpp refused to drop positions >= {start} of sequence {seq} (recurrent model?)")

    # ---- verify ----------------------------------------------------------------------------
    def verify_many(self, calls: Sequence[VerifyCall]) -> list[NumpyLogits]:
        self._ctx  # noqa: B018 - refuse on a freed context
        check_calls(calls, self.open_slots(), self.info.max_verify_rows)
        plans = [self._plan(i, call) for i, call in enumerate(calls)]  # every refusal before any decode
        out: list[NumpyLogits | None] = [None] * len(plans)
        try:
            for plan in plans:
                if plan.pre_read:
                    self._read_prompt(plan)
            groups = _pack(plans, _N_BATCH)
            for g, group in enumerate(groups):
                views = self._decode_group(group)
                last = g == len(groups) - 1
                for plan, view in zip(group, views):
                    out[plan.index] = NumpyLogits(view if last else view.copy())
        except BackendError:
            for plan in plans:  # every slot as it was: its prompt rows, tree tags and round cells go
                self._undo(plan)
            raise
        for plan in plans:
            state = self._slots[plan.call.slot]
            round_ = plan.call.round_
            state.committed = plan.start + len(plan.call.unread)
            state.pending_rows = 1 + (0 if round_ is None else round_.n)
            state.round_ = round_
            if round_ is None or not round_.n:
                state.seq_end = {}
            elif not plan.leaves:
                state.seq_end = {0: round_.n - 1}
            else:
                state.seq_end = {i + 1: leaf for i, leaf in enumerate(plan.leaves)}
        return out  # type: ignore[return-value]

    def _plan(self, index: int, call: VerifyCall) -> _Planned:
        state = self._state(call.slot)
        if state.pending_rows:
            raise BackendError(f"slot {call.slot}: verify while a previous verify is provisional; "
                               "commit or roll back first")
        t, unread, round_ = state.committed, np.asarray(call.unread, dtype=np.int64), call.round_
        n = 0 if round_ is None else round_.n
        if t + call.rows > self.slot_ctx:
            raise ContextOverflow(f"slot {call.slot}: {t} cached + {call.rows} new rows exceed its context of "
                                  f"{self.slot_ctx}")
        p = t + len(unread)  # the pending token's position
        if round_ is not None and round_.prefix_len != p + 1:
            raise BackendError(f"slot {call.slot}: round compiled for prefix_len {round_.prefix_len}, but the "
                               f"pending token sits at {p}")
        leaves: list[int] = []
        if round_ is not None and n and not _is_chain(round_):
            leaves = round_.leaves()
            if len(leaves) > self.max_tree_leaves:
                raise BackendError(f"slot {call.slot}: round has {len(leaves)} leaves but this batch was built for "
                                   f"{self.max_tree_leaves} per slot (build it with a larger max_tree_leaves)")
        pre_read = call.rows > _N_BATCH  # its prompt alone would overflow one decode: read apart first
        member = np.zeros((1 + n, self.max_tree_leaves + 1), dtype=bool)  # [1+N, 1+L] local sequences
        if leaves:
            member[:, : 1 + len(leaves)] = tree_membership(round_, leaves)
        else:
            member[:, 0] = True  # pending-only and chains: the main sequence alone
        tokens = np.concatenate([[call.pending], [] if round_ is None else round_.token_ids]).astype(np.int64)
        positions = np.concatenate([[p], [] if round_ is None else round_.position_ids]).astype(np.int64)
        outputs = np.ones(1 + n, dtype=bool)
        if len(unread) and not pre_read:  # prompt rows join the main sequence and every leaf's, no logits
            tokens = np.concatenate([unread, tokens])
            positions = np.concatenate([np.arange(t, p), positions])
            member = np.concatenate([np.repeat(member[:1], len(unread), axis=0), member])
            outputs = np.concatenate([np.zeros(len(unread), dtype=bool), outputs])
        return _Planned(index, call, t, pre_read, leaves, tokens, positions, member, outputs)

    def _read_prompt(self, plan: _Planned) -> None:
        """A long prompt's rows in decodes of their own (main sequence, no logits)."""
        unread, t = np.asarray(plan.call.unread, dtype=np.int64), plan.start
        width = self.max_tree_leaves + 1
        for start in range(0, len(unread), _N_BATCH):
            chunk = unread[start : start + _N_BATCH]
            member = np.zeros((len(chunk), width), dtype=bool)
            member[:, 0] = True
            self._fill([(plan.call.slot, chunk, np.arange(t + start, t + start + len(chunk)), member,
                         np.zeros(len(chunk), dtype=bool))])
            self._decode("a prompt read")

    def _decode_group(self, group: list[_Planned]) -> list[np.ndarray]:
        """ONE llama_decode of every call in `group`; each call's logits rows (views)."""
        for plan in group:
            if plan.leaves:
                main = self._seq_base(plan.call.slot)
                for i in range(1, len(plan.leaves) + 1):  # tag the committed prefix with each leaf
                    llama_cpp.llama_memory_seq_cp(self._mem, main, main + i, -1, -1)
        self._fill([(p.call.slot, p.tokens, p.positions, p.member, p.outputs) for p in group])
        self._decode("verify_many")
        total = sum(int(p.outputs.sum()) for p in group)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(total, self._n_vocab))
        views, row = [], 0
        for plan in group:
            k = int(plan.outputs.sum())
            views.append(logits[row : row + k])  # [1+N, V]
            row += k
        return views

    def _fill(self, parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """The llama_batch of (slot, tokens, positions, local membership, outputs) parts, in order;
        local sequence j of a slot is its id `_seq_base(slot) + j`."""
        n_seq = self._max_slots * (self.max_tree_leaves + 1)
        rows = sum(len(tokens) for _, tokens, _, _, _ in parts)
        member = np.zeros((rows, n_seq), dtype=bool)  # [R, S] row in (global) sequence?
        r = 0
        for slot, tokens, _, local, _ in parts:
            base = self._seq_base(slot)
            member[r : r + len(tokens), base : base + local.shape[1]] = local
            r += len(tokens)
        self._batch.set_tree(np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]),
                             member, np.concatenate([p[4] for p in parts]))

    def _decode(self, what: str) -> None:
        code = llama_cpp.llama_decode(self._ctx, self._batch.struct)
        if code != 0:
            raise BackendError(f"llama_decode failed during {what} (code {code}; 1 = no KV slot)")

    def _undo(self, plan: _Planned) -> None:
        """The slot of `plan` back to before the verify_many (committed prefix only)."""
        main = self._seq_base(plan.call.slot)
        for i in range(1, len(plan.leaves) + 1):
            llama_cpp.llama_memory_seq_rm(self._mem, main + i, -1, -1)
        llama_cpp.llama_memory_seq_rm(self._mem, main, plan.start, -1)

    # ---- a draft model's steps (`backends.batch.DraftBatch`) ---------------------------------
    def draft_many(self, calls: Sequence[DraftCall]) -> list[NumpyLogits]:
        """A draft model's step for many requests: every extend (a verify without candidates whose
        rows are committed at once) and every verify in ONE `verify_many`, then each tree's next
        level (`GrowRound`) in a decode of its own (a provisional slot's new rows join leaf
        sequences that `verify_many` does not plan).  Logits are copies: a later decode of the
        same call list would overwrite llama.cpp's output buffer.  A refusal (checked first)
        touches nothing; a failed decode puts each extended slot back to its length and drops
        the provisional rows of every slot it verified or grew."""
        if len({c.slot for c in calls}) < len(calls):
            raise BackendError("a slot appears twice in one forward")
        for call in calls:
            if isinstance(call, Extend) and not call.tokens:
                raise BackendError(f"slot {call.slot}: an extend needs at least one token")
        shared = [i for i, c in enumerate(calls) if not isinstance(c, GrowRound)]
        grows = {i: self._plan_grow(c) for i, c in enumerate(calls) if isinstance(c, GrowRound)}  # refusals first
        as_verify = [VerifyCall(c.slot, c.tokens[-1], None, c.tokens[:-1]) if isinstance(c, Extend) else c
                     for c in (calls[i] for i in shared)]
        before = {c.slot: self.cached_len(c.slot) for c in calls if isinstance(c, Extend)}
        out: list[NumpyLogits | None] = [None] * len(calls)
        if as_verify:  # a failed verify_many leaves every slot as it was
            for i, logits in zip(shared, self.verify_many(as_verify)):  # type: ignore[arg-type]
                out[i] = NumpyLogits(np.array(logits.logits))  # [1, V] for an extend (its last row), [1+N, V] else
        for slot in before:
            self.commit(slot, ())
        try:
            for i, growth in grows.items():
                out[i] = self._grow(calls[i], *growth)  # type: ignore[arg-type]
        except BackendError:
            for call in calls:  # extends back to their length before, provisional rows dropped
                if isinstance(call, Extend):
                    self.truncate(call.slot, before[call.slot])
                else:
                    self.rollback(call.slot)
            raise
        return out  # type: ignore[return-value]

    def _plan_grow(self, call: GrowRound) -> tuple[list[tuple[int, int]], np.ndarray, list[tuple[int, int, int]]]:
        """`plan_growth` for one slot, after the checks `verify_more` makes (nothing touched)."""
        state = self._state(call.slot)
        round_, n = call.round_, call.round_.n
        check_grows(state.round_, state.pending_rows, state.committed + 1, round_, call.first_row)
        if 1 + n > self.info.max_verify_rows:
            raise BackendError(f"slot {call.slot}: round of {1 + n} rows exceeds this backend's limit of "
                               f"{self.info.max_verify_rows}")
        if state.committed + 1 + n > self.slot_ctx:
            raise ContextOverflow(f"slot {call.slot}: {state.committed} cached + {1 + n} rows exceed its context of "
                                  f"{self.slot_ctx}")
        return plan_growth(round_, call.first_row, state.seq_end, self.max_tree_leaves, state.committed)

    def _grow(self, call: GrowRound, leaves: list[tuple[int, int]], local: np.ndarray,
              copies: list[tuple[int, int, int]]) -> NumpyLogits:
        """`Backend.verify_more` on one slot, as `_plan_grow` planned it: rows [first_row, N) on
        top of its provisional tree."""
        state = self._state(call.slot)
        round_, first = call.round_, call.first_row
        self._give_ancestors(call.slot, copies)
        state.seq_end.update({seq: leaf for leaf, seq in leaves})
        state.round_, state.pending_rows = round_, 1 + round_.n  # before the decode: a failure rolls back every row
        member = np.zeros((round_.n - first, self.max_tree_leaves + 1), dtype=bool)  # [M, 1+L]
        member[:, : local.shape[1]] = local
        self._fill([(call.slot, round_.token_ids[first:], round_.position_ids[first:], member,
                     np.ones(round_.n - first, dtype=bool))])
        try:
            self._decode("a draft tree's next level")
        except BackendError:
            self.rollback(call.slot)
            raise
        rows = round_.n - first
        return NumpyLogits(np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx),
                                                 shape=(rows, self._n_vocab)).copy())  # [M, V]

    def _give_ancestors(self, slot: int, copies: Sequence[tuple[int, int, int]]) -> None:
        """Each (source, new, end) of local sequences: the new leaf's sequence gets positions
        [0, end) of the source's, its committed prefix and provisional ancestors."""
        base = self._seq_base(slot)
        for source, seq, end in copies:
            llama_cpp.llama_memory_seq_cp(self._mem, base + source, base + seq, -1, end)

    # ---- settle ----------------------------------------------------------------------------
    def commit(self, slot: int, accepted_rows: Sequence[int]) -> None:
        state = self._state(slot)
        if not state.pending_rows:
            raise BackendError(f"slot {slot}: commit() without a provisional verify")
        t, k = state.committed, len(accepted_rows)
        end = t + 1 + k  # the main sequence will hold positions [0, end)
        if state.round_ is None:
            if k:
                raise BackendError(f"slot {slot}: accepted rows {list(accepted_rows)}, but the verify had no "
                                   "candidate rows")
            local = 0
        else:
            local = seq_through(state.round_, state.seq_end, accepted_rows)
        main = self._seq_base(slot)
        leaves = sorted(set(state.seq_end) - {0})
        for leaf in leaves:  # every other leaf's cells and tags go
            if leaf != local:
                self._seq_rm(main + leaf, -1)
        if local == 0:
            self._seq_rm(main, end)  # a chain's tail past the accepted rows
        else:
            seq = main + local
            self._seq_rm(seq, end)  # rows below the accepted node, when it is not a leaf
            llama_cpp.llama_memory_seq_cp(self._mem, seq, main, -1, -1)
            self._seq_rm(seq, -1)
        state.committed = end
        state.pending_rows = 0
        state.round_, state.seq_end = None, {}

    def rollback(self, slot: int) -> None:
        state = self._state(slot)
        if not state.pending_rows:
            return
        main = self._seq_base(slot)
        for leaf in sorted(set(state.seq_end) - {0}):
            self._seq_rm(main + leaf, -1)
        self._seq_rm(main, state.committed)
        state.pending_rows = 0
        state.round_, state.seq_end = None, {}

    def truncate(self, slot: int, length: int) -> None:
        self.rollback(slot)
        state = self._state(slot)
        if length < state.committed:
            self._seq_rm(self._seq_base(slot), length)
            state.committed = length

    def kv_bytes(self, slot: int | None = None) -> int:
        """Cells in use times bytes per cell (committed + provisional rows; a tree shares its
        slot's prefix cells).  None: every open slot (slots share no cell)."""
        slots = self._slots.values() if slot is None else [self._state(slot)]
        return sum(s.committed + s.pending_rows for s in slots) * self.geometry.bytes_per_cell

    # ---- text ------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.backend.tokenize(text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.backend.detokenize(tokens)

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        return self.backend.chat_prompt(messages)


def _pack(plans: list[_Planned], capacity: int) -> list[list[_Planned]]:
    """Whole calls into decodes of at most `capacity` rows, in call order (one when they fit)."""
    groups: list[list[_Planned]] = [[]]
    rows = 0
    for plan in plans:
        if groups[-1] and rows + plan.rows > capacity:
            groups.append([])
            rows = 0
        groups[-1].append(plan)
        rows += plan.rows
    return groups if groups[-1] else []


# ---- batch invariance ------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchInvarianceCase:
    slots: int  # B: calls in the shared forward
    candidates: int  # chain candidates per call (0 = pending-only)
    vs_alone: float  # max |dlogit| between a slot's rows in the shared forward and the same call alone (B = 1)
    vs_single: float  # ... and the same rows on a single-sequence `LlamaCppBackend` (its verify)


def probe_batch_invariance(batch: LlamaCppBatch, single: LlamaCppBackend, slot_counts: Sequence[int] = (1, 2, 4, 8),
                           candidates: Sequence[int] = (0, 3), prefix_len: int = 24,
                           seed: int = 0) -> list[BatchInvarianceCase]:
    """For B slots, each with its own prefix (lengths prefix_len + 7 * i, random text), verify
    every slot's pending token (and a chain of `candidates` rows) in one `verify_many`, and
    compare each slot's rows with the same call verified alone on the batch and with the same
    verify on `single` (same weights).  Slots opened here are closed again; needs B free slots."""
    rng = np.random.default_rng(seed)
    from draftwise.backends.profile import chain_round

    out = []
    vocab = batch.info.vocab_size
    for b in slot_counts:
        for n in candidates:
            prefixes = [[int(x) for x in rng.integers(100, 20000, prefix_len + 7 * i + 1 + n)] for i in range(b)]
            slots = [batch.open() for _ in range(b)]
            try:
                rounds = []
                for slot, tokens in zip(slots, prefixes):
                    batch.verify_many([VerifyCall(slot, tokens[-2 - n], None, tuple(tokens[: -2 - n]))])
                    batch.commit(slot, ())
                    p = batch.cached_len(slot)
                    rounds.append(chain_round(p + 1, n, vocab, tokens[-n:]) if n else None)
                calls = [VerifyCall(s, tokens[-1 - n], r) for s, tokens, r in zip(slots, prefixes, rounds)]
                shared = [np.array(x.logits, dtype=np.float64) for x in batch.verify_many(calls)]
                for s in slots:
                    batch.rollback(s)
                alone = []
                for call in calls:
                    alone.append(np.array(batch.verify_many([call])[0].logits, dtype=np.float64))
                    batch.rollback(call.slot)
                ref = []
                for tokens, r in zip(prefixes, rounds):
                    single.reset()
                    single.extend(tokens[: -1 - n])
                    ref.append(np.array(single.verify(tokens[-1 - n], r).logits, dtype=np.float64))
                    single.rollback()
                single.reset()
            finally:
                for s in slots:
                    batch.close(s)
            out.append(BatchInvarianceCase(
                b, n, max(float(np.max(np.abs(x - y))) for x, y in zip(shared, alone)),
                max(float(np.max(np.abs(x - y))) for x, y in zip(shared, ref))))
    return out


def time_verify_many(batch: LlamaCppBatch, slot_counts: Sequence[int] = (1, 2, 4, 8), prefix_len: int = 128,
                     repeats: int = 5, seed: int = 0) -> list[tuple[int, float, float]]:
    """(B, seconds of one verify_many of B pending-only calls, seconds of B verify_many calls
    of one each), best of `repeats`, prefixes of `prefix_len` random tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in slot_counts:
        slots = [batch.open() for _ in range(b)]
        try:
            for s in slots:
                batch.verify_many([VerifyCall(s, int(rng.integers(100, 20000)), None,
                                              tuple(int(x) for x in rng.integers(100, 20000, prefix_len)))])
                batch.commit(s, ())
            calls = [VerifyCall(s, int(rng.integers(100, 20000)), None) for s in slots]
            rows.append((b, _best(lambda c=calls: _settle(batch, c), repeats),
                         _best(lambda c=calls: [_settle(batch, [call]) for call in c], repeats)))
        finally:
            for s in slots:
                batch.close(s)
    return rows


def _settle(batch: LlamaCppBatch, calls: list[VerifyCall]) -> None:
    batch.verify_many(calls)
    for call in calls:
        batch.rollback(call.slot)


def _best(fn, repeats: int) -> float:
    fn()  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
