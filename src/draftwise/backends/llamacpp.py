"""The llama.cpp runtime (llama-cpp-python's low-level API): GGUF models at full CPU speed.

`LlamaCppBatch` holds slots (requests, each with its own KV) on one llama.cpp context: verify,
draft steps, commit, rollback, truncate, trees, strict kernels and hidden states are written
there once.  `LlamaCppBackend` is the one slot of a one-slot `LlamaCppBatch` as a `Backend`.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass, field, replace
from typing import Sequence

import llama_cpp
import numpy as np

from draftwise.backends.base import (
    BackendError,
    BackendInfo,
    ContextOverflow,
    TokenWeights,
    check_grows,
    check_path,
    tokenizer_fingerprint,
)
from draftwise.backends.batch import DraftCall, DraftSlot, Extend, GrowRound, HiddenSlotView, VerifyCall, check_calls
from draftwise.backends.llamacpp_text import detokenize, model_meta, render_chat, tokenize, vocab_texts
from draftwise.backends.llamacpp_tokens import TokenArrays
from draftwise.runtime.logits import NumpyLogits
from draftwise.models import ResolvedModel
from draftwise.runtime.text import check_messages
from draftwise.topology.compile import CompiledRound

_KV_TYPE = llama_cpp.GGML_TYPE_F16  # K and V cache type, fixed so kv_bytes can be computed exactly
_KV_TYPE_BYTES = 2
LLAMACPP_MAX_SEQUENCES = 256  # LLAMA_MAX_SEQ: sequences one llama.cpp context holds
_N_BATCH = 512  # tokens per llama_decode (logical and physical batch), llama-cpp-python's default
_ONE_ROW = np.ones((1, 1), dtype=bool)  # a row in its slot's main sequence alone (never written)
_ONE_ROW.flags.writeable = False


@dataclass(frozen=True)
class LlamaCppKernels:
    """The kernel choices that decide whether a row verified inside a batch equals the same row
    decoded alone (`draftwise profile --invariance` measures it; the study is
    benchmarks/llamacpp_exactness/).  By default it does not, on these CPU kernels:
    - flash attention off: attention's matmuls of a one-row batch use ggml's own dot product,
      two or more rows go to tinyBLAS (another summation order); and a tree row's ancestors sit
      at scattered cache cells, so its dot products group them into SIMD lanes differently
      from the contiguous cells of plain decoding;
    - flash attention on: one query row's keys are split over the threads (partial sums merged),
      two or more rows are not; masked cells are skipped, so a tree row sums exactly its path;
    - repacked Q4_K weights multiply rows 4 by 4 with a gemm kernel and the rest with a gemv;
      unpacked Q4_K weights switch kernels at 8 rows.
    A last-bit difference then moves a whole 8-bit step where the next layer re-quantizes its
    input, which is how a rounding difference becomes a visible change in a logit."""

    flash_attn: bool = False  # llama-cpp-python's default
    repack: bool = True  # llama.cpp's interleaved weight layouts (use_extra_bufts), its default
    min_rows: int = 1  # every decode evaluates at least this many rows; throwaway rows pad it
    # a tree commit leaves its rejected rows' cells held (by a graveyard sequence) instead of
    # freeing them: freed cells between accepted ones would be refilled by later tokens, whose
    # cells would then sit out of position order, and flash attention sums cells in index order
    keep_rejected_cells: bool = False

    @property
    def strict(self) -> bool:
        return self.min_rows > 1 or self.keep_rejected_cells

    def describe(self) -> str:
        return (f"flash attention {'on' if self.flash_attn else 'off'}, repacked weights "
                f"{'on' if self.repack else 'off'}, decodes of >= {self.min_rows} row(s)"
                + (", rejected tree cells kept" if self.keep_rejected_cells else ""))


DEFAULT_KERNELS = LlamaCppKernels()
# Strict kernels: rows bit-identical to plain decoding's up to the row count the probe measures
# for the model (which becomes `max_verify_rows`).  Both decode >= 2 rows, so a plain step takes
# a verify's kernels (and, with flash attention, no thread splits one query's keys).
# - for chains: flash attention stays off, so a verify costs what it costs by default (flash
#   attention is slower on these CPU kernels); a chain's candidate cells follow the committed
#   ones, so its rows sum the same cells in the same lanes as plain decoding's, but a tree's do
#   not.  `invariance.load_strict` also tries them with unpacked weights (for Q4_K, whose
#   repacked gemm splits rows 4 by 4) and keeps the better measured.
# - for trees: flash attention (a tree row sums exactly its path's cells, in order), weights not
#   repacked, and rejected tree cells kept (see `keep_rejected_cells`).
STRICT_CHAIN_KERNELS = LlamaCppKernels(min_rows=2)
STRICT_TREE_KERNELS = LlamaCppKernels(flash_attn=True, repack=False, min_rows=2, keep_rejected_cells=True)


@dataclass(frozen=True)
class KvGeometry:
    """What one KV cell costs: n_layer * (n_embd_k_gqa + n_embd_v_gqa) * element size."""

    n_layer: int
    n_embd_k_gqa: int  # n_head_kv * key_length
    n_embd_v_gqa: int  # n_head_kv * value_length
    type_bytes: int

    @property
    def bytes_per_cell(self) -> int:
        return self.n_layer * (self.n_embd_k_gqa + self.n_embd_v_gqa) * self.type_bytes


class _Context:
    """A llama.cpp context, freed once: by its batch, or with the weights it runs on."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def free(self) -> None:
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None


def _free_weights(handle, contexts: list[_Context]) -> None:
    for context in contexts:  # a context must not outlive its model
        context.free()
    contexts.clear()
    llama_cpp.llama_model_free(handle)


def _free_context(contexts: list[_Context], context: _Context) -> None:
    context.free()
    if context in contexts:
        contexts.remove(context)


class LlamaCppWeights:
    """A loaded GGUF and what is read from it once (vocabulary, metadata, token weights); the
    contexts made on it (`context`) are freed before it (`free`, or when it is collected)."""

    def __init__(self, model: ResolvedModel, n_threads: int | None, kernels: LlamaCppKernels) -> None:
        if model.kind != "gguf":
            raise BackendError(f"the llama.cpp backend loads .gguf files; {model.path!r} is a {model.kind}")
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = kernels.repack
        handle = llama_cpp.llama_model_load_from_file(model.path.encode(), mparams)
        if not handle:
            raise BackendError(f"llama.cpp could not load {model.path!r}")
        self.handle, self.path, self.kernels = handle, model.path, kernels
        self.contexts: list[_Context] = []
        self._finalizer = weakref.finalize(self, _free_weights, handle, self.contexts)
        self.n_threads = n_threads or len(os.sched_getaffinity(0))
        self.vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_embd = int(llama_cpp.llama_model_n_embd(handle))
        self.geometry = _kv_geometry(handle)
        self.chat_template = model_meta(handle, "tokenizer.chat_template")
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        eos = {int(llama_cpp.llama_vocab_eos(self.vocab)), int(llama_cpp.llama_vocab_eot(self.vocab))} - {-1}
        self.info = BackendInfo(
            name="llamacpp",
            checkpoint=model.checkpoint_id,
            tokenizer_hash=tokenizer_fingerprint(vocab_texts(self.vocab, n_vocab)),
            vocab_size=n_vocab,
            context_length=0,  # each batch states its slots' window
            dtype="gguf" if kernels == DEFAULT_KERNELS else f"gguf ({kernels.describe()})",  # keys measured artifacts
            device="cpu",
            eos_token_ids=frozenset(eos),
            max_verify_rows=_N_BATCH,
            kv_row_bytes=self.geometry.bytes_per_cell,
        )
        self._token_weights: TokenWeights | None = None

    def free(self) -> None:
        self._finalizer()

    def context(self, n_ctx: int, n_seq: int, unified: bool) -> _Context:
        if not self._finalizer.alive:
            raise BackendError(f"the weights of {self.path!r} were freed (their backend was closed)")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = _N_BATCH
        cparams.n_ubatch = _N_BATCH
        cparams.n_seq_max = n_seq
        # unified: one cell can belong to many sequences (a tree's prefix is shared, not copied); else
        # one stream of n_ctx / n_seq cells per sequence, each row attending over its own stream only
        cparams.kv_unified = unified
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.type_k = _KV_TYPE
        cparams.type_v = _KV_TYPE
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.kernels.flash_attn
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.embeddings = False  # switched on per decode (llama_set_embeddings) for hidden states
        ctx = llama_cpp.llama_init_from_model(self.handle, cparams)
        if ctx and llama_cpp.llama_pooling_type(ctx) != llama_cpp.LLAMA_POOLING_TYPE_NONE:
            # hidden states are per-token embeddings: pooling NONE, which a causal LM that declares
            # no pooling gets by default (asking for it explicitly makes llama.cpp warn on those)
            llama_cpp.llama_free(ctx)
            cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
            ctx = llama_cpp.llama_init_from_model(self.handle, cparams)
        if not ctx:
            raise BackendError(f"llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seq}) "
                               f"for {self.path!r}")
        context = _Context(ctx)
        self.contexts.append(context)
        return context

    def token_weights(self) -> TokenWeights:
        if self._token_weights is None:
            self._token_weights = gguf_token_weights(self.path, self.info.vocab_size, self.n_embd)
        return self._token_weights


@dataclass
class _Slot:
    """One open slot's state (local sequence ids: 0 = its main sequence, 1 + i = leaf i)."""

    committed: int = 0  # positions [0, committed) of the main sequence are authoritative
    pending_rows: int = 0  # provisional rows of the last verify (pending included)
    round_: CompiledRound | None = None  # the provisional round; None for a pending-only verify
    # local sequence -> the candidate row its path ends at: a chain lives in the main sequence,
    # leaf i of a tree in sequence i + 1; every provisional row lies on the path of some sequence
    seq_end: dict[int, int] = field(default_factory=dict)
    dead: int = 0  # rejected tree rows' cells the graveyard holds (strict kernels), until reset
    track: bool = False  # keep hidden states (draft heads read them)
    rows_hidden: np.ndarray | None = None  # [1 + N, d] of the provisional rows (pending first)
    frontier: np.ndarray | None = None  # [d] of committed row committed - 1


@dataclass
class _Part:
    """One call's rows in a decode: local sequences per row; its last `outputs` rows return logits
    (the rows before are prompt rows); `hidden`: the decode runs with embeddings on for it."""

    slot: int
    tokens: Sequence[int]  # [R]
    positions: Sequence[int]  # [R]
    member: np.ndarray  # [R, S'] bool
    outputs: int
    hidden: bool = False


@dataclass
class _Planned:
    """One verify-shaped call (a `VerifyCall`, or an `Extend`), checked and laid out."""

    index: int  # into the calls
    call: VerifyCall
    start: int  # the slot's committed length before the call
    pre_read: Sequence[int]  # unread rows decoded before (and apart from) the round's batch
    leaves: list[int]  # a tree's leaf rows ([] for pending-only and chains)
    part: _Part
    hidden: np.ndarray | None = None  # [1 + N, d] once decoded, where the slot keeps them


class LlamaCppBatch:
    """Slots on one llama.cpp context; the `DraftBatch` of llama.cpp (a draft model's steps too).

    Sequences: slot i owns ids [i * (L + 1), (i + 1) * (L + 1)), L = `max_tree_leaves`: its main
    sequence (the committed text) and one per tree leaf; a row carries only its own slot's ids,
    and llama.cpp lets a query see the cells of its (first) sequence at positions <= its own, so
    no row attends to another slot's cells.  A chain round (and a pending-only one) lives in the
    main sequence.  A tree round first `seq_cp`s the main sequence into each leaf's (a unified
    cache adds the id to the same cells, nothing is copied); the pending row joins every one of
    the slot's sequences and candidate row r those of the leaves below it, so siblings never see
    each other.  Commit keeps the accepted path in the main sequence with per-sequence
    `seq_rm` / `seq_cp` (`seq_keep` would drop every other slot); the prefix is never re-read.

    KV layout: one unified cache when trees are possible (L > 0: a cell joins the sequences of
    several leaves) or there is one slot; a batch of chains keeps one KV stream of `slot_ctx`
    cells per slot (a row attends over its own slot's cells only: cheaper, and a slot's rows
    equal the one-slot backend's wherever the kernels are row-invariant).  The context holds
    `max_slots * slot_ctx` cells, so every slot may fill its window; a slot that would pass it
    is refused with `ContextOverflow` before anything is decoded.

    A verify's prompt rows (`unread`) share its decode when `info.prompt_shares_round`, else are
    read first in decodes of their own; calls of more than one decode's rows are packed into
    several.  A failed decode leaves every slot as it was.  Logits of the last decode are views
    of llama.cpp's buffer (valid until the next decode), earlier ones copies.

    Strict kernels (one slot only: a shared batch's rows are not plain decoding's anyway): every
    decode is padded to `min_rows` with throwaway rows dropped right after, and a tree commit
    hands its rejected rows' cells to a graveyard sequence (the last id) instead of freeing them,
    until `reset`; those cells count against the slot's window.

    Hidden states (`track_hidden`, for draft heads): a decode that carries a tracking slot's
    round runs with embeddings on (`llama_set_embeddings`), so llama.cpp also returns the
    final-norm row (the LM head's input) of every row; llama.cpp outputs EVERY row while they
    are on, so a tracking slot's prompt rows are read apart with them off.
    """

    def __init__(self, weights: LlamaCppWeights, max_slots: int, max_tree_leaves: int, slot_ctx: int,
                 prompt_shares_round: bool = True, owns_weights: bool = False) -> None:
        kernels = weights.kernels
        if max_slots < 1:
            raise BackendError(f"a batch needs at least one slot, got {max_slots}")
        if max_slots > 1 and kernels.strict:
            raise BackendError(f"strict kernels ({kernels.describe()}) are for one slot: a shared batch's rows are "
                               "not plain decoding's anyway (see probe_batch_invariance); load the backend with "
                               "default kernels")
        if max_tree_leaves < 0:
            raise BackendError(f"max_tree_leaves must be >= 0, got {max_tree_leaves}")
        if max_slots * (max_tree_leaves + 1) + kernels.keep_rejected_cells > LLAMACPP_MAX_SEQUENCES:
            raise BackendError(
                f"{max_slots} slot(s) x ({max_tree_leaves} tree leaves + 1) need more than the "
                f"{LLAMACPP_MAX_SEQUENCES} sequences a llama.cpp context holds (fewer slots, or a narrower tree)")
        if slot_ctx < 2:
            raise BackendError(f"a slot's context must hold at least 2 tokens, got {slot_ctx}")
        self.weights = weights
        self._owns_weights = owns_weights
        self._max_slots = max_slots
        self.max_tree_leaves = max_tree_leaves
        self.slot_ctx = slot_ctx
        self.kernels = kernels
        self.geometry = weights.geometry
        self.info: BackendInfo = replace(weights.info, context_length=slot_ctx,
                                         prompt_shares_round=prompt_shares_round)
        self._n_vocab = weights.info.vocab_size
        self._slots: dict[int, _Slot] = {}
        self._finalizer: weakref.finalize | None = None
        self._make_context()

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_backend(cls, backend: LlamaCppBackend, max_slots: int = 8, max_tree_leaves: int | None = None,
                     slot_ctx: int | None = None) -> LlamaCppBatch:
        """A batch context on `backend`'s loaded weights (nothing is loaded again).  Each slot's
        window is `slot_ctx` (default: the backend's context length); the context holds
        `max_slots * slot_ctx` cells.  Trees of up to `max_tree_leaves` leaves (default: what the
        backend was reserved for).  Closing `backend` frees this context too."""
        leaves = backend.max_tree_leaves if max_tree_leaves is None else max_tree_leaves
        batch = cls(backend.batch.weights, max_slots, leaves, slot_ctx or backend.info.context_length)
        batch.info = replace(batch.info, max_verify_rows=backend.info.max_verify_rows)
        return batch

    @property
    def unified(self) -> bool:
        """One KV cache for every slot, else one stream per slot (see the class docstring)."""
        return self.max_tree_leaves > 0 or self._max_slots == 1

    @property
    def _graveyard(self) -> int | None:
        """The sequence that holds rejected tree cells (strict kernels), else None."""
        return self._max_slots * (self.max_tree_leaves + 1) if self.kernels.keep_rejected_cells else None

    def _make_context(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # the old context goes first
        n_seq = self._max_slots * (self.max_tree_leaves + 1)
        context = self.weights.context(self._max_slots * self.slot_ctx, n_seq + self.kernels.keep_rejected_cells,
                                       self.unified)
        self._context = context
        self._finalizer = weakref.finalize(self, _free_context, self.weights.contexts, context)
        self._mem = llama_cpp.llama_get_memory(context.ctx)
        if self._max_slots == 1:  # llama.cpp rounds n_ctx up: a lone slot's window is every cell
            self.slot_ctx = int(llama_cpp.llama_n_ctx(context.ctx))
            self.info = replace(self.info, context_length=self.slot_ctx)
        self._tokens = TokenArrays(_N_BATCH, n_seq)
        self._embd_on = False

    def free(self) -> None:
        """Free the context now (and the weights, when this batch owns them)."""
        assert self._finalizer is not None
        self._finalizer()
        if self._owns_weights:
            self.weights.free()

    @property
    def _ctx(self):
        ctx = self._context.ctx
        if ctx is None:
            raise BackendError("this batch's llama.cpp context was freed (its backend was closed, or free() called)")
        return ctx

    def cap_verify_rows(self, rows: int) -> None:
        """Verify at most `rows` rows at once (pending included): the engine caps its rounds at
        this, and a larger round is refused (strict kernels are bit-exact only up to it)."""
        if not 2 <= rows <= _N_BATCH:
            raise BackendError(f"a verify cap must be 2..{_N_BATCH} rows, got {rows}")
        self.info = replace(self.info, max_verify_rows=rows)

    # ---- slots -----------------------------------------------------------------------------
    @property
    def max_slots(self) -> int:
        return self._max_slots

    @property
    def n_threads(self) -> int:
        return self.weights.n_threads

    def open(self) -> int:
        self._ctx  # noqa: B018 - refuse on a freed context
        free = [s for s in range(self._max_slots) if s not in self._slots]
        if not free:
            raise BackendError(f"all {self._max_slots} slots are open")
        self._slots[free[0]] = _Slot()
        return free[0]

    def close(self, slot: int) -> None:
        self._state(slot)
        self._clear(slot)
        del self._slots[slot]

    def open_slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._slots))

    def cached_len(self, slot: int) -> int:
        return self._state(slot).committed

    def reserve(self, slot: int, tree_rows: int) -> None:
        """A sequence per leaf of trees of up to `tree_rows` branching rows on `slot` (a tree never
        has more leaves than rows); never shrinks.  Beyond the context's budget the context is
        made again, which drops this slot's KV and is refused while another slot holds cells."""
        self._state(slot)
        leaves = min(tree_rows, (LLAMACPP_MAX_SEQUENCES - self.kernels.keep_rejected_cells) // self._max_slots - 1)
        if leaves <= self.max_tree_leaves:
            return
        if any(s.committed or s.pending_rows for k, s in self._slots.items() if k != slot):
            raise BackendError(
                f"slot {slot}: trees of {tree_rows} rows need {leaves} leaf sequences per slot but this batch holds "
                f"{self.max_tree_leaves}, and a larger budget remakes the context, which drops every slot's KV "
                "(build it with a larger max_tree_leaves)")
        self.max_tree_leaves = leaves
        self._make_context()
        self.reset(slot)

    def reset(self, slot: int) -> None:
        state = self._state(slot)
        self._clear(slot)
        self._slots[slot] = _Slot(track=state.track)

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
        """Every cell of the slot goes (its main and leaf sequences, and the graveyard's)."""
        for seq in self.seq_ids(slot):
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        if self._graveyard is not None:  # only a one-slot batch has one
            llama_cpp.llama_memory_seq_rm(self._mem, self._graveyard, -1, -1)

    def _seq_rm(self, seq: int, start: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, start, -1):
            raise BackendError(f"llama.cpp refused to drop positions >= {start} of sequence {seq} (recurrent model?)")

    def _check_room(self, slot: int, state: _Slot, rows: int) -> None:
        rows = max(rows, self.kernels.min_rows)  # pad rows hold cells while the decode runs
        if state.committed + state.dead + rows > self.slot_ctx:
            held = f" + {state.dead} rejected tree cells held (strict)" if state.dead else ""
            raise ContextOverflow(f"slot {slot}: {state.committed} cached{held} + {rows} new rows exceed its "
                                  f"context of {self.slot_ctx}")

    # ---- hidden states (draft heads) -------------------------------------------------------
    def track_hidden(self, slot: int, on: bool = True) -> None:
        self._state(slot).track = on

    def frontier_hidden(self, slot: int) -> np.ndarray | None:
        return self._state(slot).frontier

    def token_weights(self) -> TokenWeights:
        return self.weights.token_weights()

    # ---- decoding --------------------------------------------------------------------------
    def _run(self, parts: list[_Part], what: str) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """ONE llama_decode of `parts`: per part its logits rows [k, V] (views of llama.cpp's
        buffer, valid until the next decode) and, where it wants them, its hidden rows [k, d]."""
        embd = any(p.hidden for p in parts)
        if embd != self._embd_on:
            llama_cpp.llama_set_embeddings(self._ctx, embd)
            self._embd_on = embd
        self._fill(parts, embd)
        padding = self._tokens.pad_to(self.kernels.min_rows)
        code = llama_cpp.llama_decode(self._ctx, self._tokens.struct)
        if padding is not None:
            sequences, first, end = padding
            for seq in sequences:  # the pad cells, and only them: nothing of the batch's own rows
                llama_cpp.llama_memory_seq_rm(self._mem, seq, first, end)
        if code != 0:
            raise BackendError(f"llama_decode failed during {what} (code {code}; 1 = no KV slot: n_ctx too small)")
        # llama.cpp outputs every row while embeddings are on; re-read the pointers after every
        # decode: llama.cpp may reallocate its output buffers
        total = sum(len(p.tokens) for p in parts) if embd else sum(p.outputs for p in parts)
        if not total:  # a prompt read: no row was asked for
            return [(np.zeros((0, self._n_vocab), dtype=np.float32), None) for _ in parts]
        logits = _float_rows(llama_cpp.llama_get_logits(self._ctx), total, self._n_vocab)
        hidden = None
        if embd:
            pointer = llama_cpp.llama_get_embeddings(self._ctx)
            if not pointer:
                raise BackendError("llama.cpp returned no embeddings for a decode with embeddings on")
            hidden = _float_rows(pointer, total, self.weights.n_embd)  # [R, d]
        out: list[tuple[np.ndarray, np.ndarray | None]] = []
        row = 0
        for part in parts:
            start = row + len(part.tokens) - part.outputs if embd else row
            rows = slice(start, start + part.outputs)
            out.append((logits[rows], hidden[rows].copy() if hidden is not None and part.hidden else None))
            row += len(part.tokens) if embd else part.outputs
        return out

    def _fill(self, parts: list[_Part], all_outputs: bool) -> None:
        """The llama_batch of `parts`, in order; local sequence j of a slot is `_seq_base(slot) + j`."""
        if len(parts) == 1 and parts[0].member.shape == (1, 1):  # plain decoding's step: one row, main sequence
            part = parts[0]
            self._tokens.set_one(int(part.tokens[0]), int(part.positions[0]), self._seq_base(part.slot),
                                all_outputs or part.outputs > 0)
            return
        rows = sum(len(p.tokens) for p in parts)
        member = np.zeros((rows, self._tokens.n_seq), dtype=bool)  # [R, S] row in (global) sequence?
        outputs = np.ones(rows, dtype=bool)
        r = 0
        for part in parts:
            base, n = self._seq_base(part.slot), len(part.tokens)
            member[r : r + n, base : base + part.member.shape[1]] = part.member
            if not all_outputs:
                outputs[r : r + n - part.outputs] = False
            r += n
        self._tokens.set_rows(np.concatenate([p.tokens for p in parts]), np.concatenate([p.positions for p in parts]),
                             member, outputs)

    # ---- verify ----------------------------------------------------------------------------
    def verify_many(self, calls: Sequence[VerifyCall]) -> list[NumpyLogits]:
        """ONE decode of every call's rows (`BatchBackend.verify_many`); see the class docstring."""
        check_calls(calls, self.open_slots(), self.info.max_verify_rows)
        return self._verify([self._plan(i, call, self.info.prompt_shares_round) for i, call in enumerate(calls)])

    def _verify(self, plans: list[_Planned]) -> list[NumpyLogits]:
        """Decode checked plans (every refusal came before): prompt reads apart, then the rounds
        packed into as few decodes as fit; a failure leaves every slot as it was."""
        self._ctx  # noqa: B018 - refuse on a freed context
        out: dict[int, NumpyLogits] = {}  # by plan index
        try:
            for plan in plans:
                self._read_prompt(plan)
            groups = _pack(plans, _N_BATCH)
            for g, group in enumerate(groups):
                for plan in group:
                    main = self._seq_base(plan.call.slot)
                    for i in range(1, len(plan.leaves) + 1):  # tag the committed prefix with each leaf
                        llama_cpp.llama_memory_seq_cp(self._mem, main, main + i, -1, -1)
                last = g == len(groups) - 1
                for plan, (logits, hidden) in zip(group, self._run([p.part for p in group], "verify")):
                    out[plan.index] = NumpyLogits(logits if last else logits.copy())  # [1+N, V]
                    plan.hidden = hidden
        except BackendError:
            for plan in plans:  # every slot as it was: its prompt rows, tree tags and round cells go
                main = self._seq_base(plan.call.slot)
                for i in range(1, len(plan.leaves) + 1):
                    llama_cpp.llama_memory_seq_rm(self._mem, main + i, -1, -1)
                llama_cpp.llama_memory_seq_rm(self._mem, main, plan.start, -1)
            raise
        for plan in plans:
            state, round_ = self._slots[plan.call.slot], plan.call.round_
            n = 0 if round_ is None else round_.n
            state.committed = plan.start + len(plan.call.unread)
            if plan.call.unread:
                state.frontier = None  # the prompt's rows carry no state (the round's rows carry the next one)
            state.pending_rows, state.round_, state.rows_hidden = 1 + n, round_, plan.hidden
            if not n:
                state.seq_end = {}
            elif not plan.leaves:
                state.seq_end = {0: n - 1}
            else:
                state.seq_end = {i + 1: leaf for i, leaf in enumerate(plan.leaves)}
        return [out[plan.index] for plan in plans]

    def _plan(self, index: int, call: VerifyCall, shares: bool) -> _Planned:
        """`call` checked (nothing touched) and laid out; `shares`: its prompt rows may join its
        round's decode (they do unless its slot tracks hidden states or it exceeds one decode)."""
        state = self._state(call.slot)
        if state.pending_rows:
            raise BackendError(f"slot {call.slot}: verify while a previous verify is provisional; "
                               "commit or roll back first")
        t, round_ = state.committed, call.round_
        n = 0 if round_ is None else round_.n
        self._check_room(call.slot, state, call.rows)
        p = t + len(call.unread)  # the pending token's position
        if round_ is not None and round_.prefix_len != p + 1:
            raise BackendError(f"slot {call.slot}: round compiled for prefix_len {round_.prefix_len}, but the "
                               f"pending token sits at {p}")
        leaves: list[int] = []
        if n and not _is_chain(round_):
            leaves = round_.leaves()
            if len(leaves) > self.max_tree_leaves:
                raise BackendError(f"slot {call.slot}: round has {len(leaves)} leaves but this context was built "
                                   f"for {self.max_tree_leaves} per slot (reserve a larger tree budget first)")
        if n:
            tokens = np.concatenate([[call.pending], round_.token_ids])  # [1+N]
            positions = np.concatenate([[p], round_.position_ids])
            member = tree_membership(round_, leaves) if leaves else np.ones((1 + n, 1), dtype=bool)
        else:  # plain decoding's step: no numpy work
            tokens, positions, member = [call.pending], [p], _ONE_ROW
        pre_read: Sequence[int] = ()
        if call.unread and (not shares or state.track or call.rows > _N_BATCH):
            pre_read = call.unread
        elif call.unread:  # prompt rows join the main sequence and every leaf's, no logits
            tokens = np.concatenate([call.unread, tokens])
            positions = np.concatenate([np.arange(t, p), positions])
            member = np.concatenate([np.ones((len(call.unread), member.shape[1]), dtype=bool), member])
        return _Planned(index, call, t, pre_read, leaves, _Part(call.slot, tokens, positions, member, 1 + n, state.track))

    def _read_prompt(self, plan: _Planned) -> None:
        """A plan's prompt rows read apart: in the main sequence, no logits, embeddings off."""
        t = plan.start
        for start in range(0, len(plan.pre_read), _N_BATCH):
            chunk = plan.pre_read[start : start + _N_BATCH]
            self._run([_Part(plan.call.slot, chunk, range(t + start, t + start + len(chunk)),
                             np.ones((len(chunk), 1), dtype=bool), 0)], "a prompt read")

    # ---- a draft model's steps (`backends.batch.DraftBatch`) -------------------------------
    def draft_many(self, calls: Sequence[DraftCall]) -> list[NumpyLogits]:
        """A draft model's step for many requests: every extend (a verify without candidates whose
        rows are committed at once) and every verify in ONE decode where they fit, then each
        tree's next level (`GrowRound`) in a decode of its own (a provisional slot's new rows join
        leaf sequences that `verify_many` does not plan).  Logits are copies.  A refusal (checked
        first) touches nothing; a failed decode puts each extended slot back to its length and
        drops the provisional rows of every slot it verified or grew."""
        if len({c.slot for c in calls}) < len(calls):
            raise BackendError("a slot appears twice in one forward")
        for call in calls:
            if isinstance(call, Extend) and not call.tokens:
                raise BackendError(f"slot {call.slot}: an extend needs at least one token")
        verifies = [c for c in calls if isinstance(c, VerifyCall)]
        check_calls(verifies, self.open_slots(), self.info.max_verify_rows)
        plans = [self._plan(i, VerifyCall(c.slot, c.tokens[-1], None, c.tokens[:-1]), True) if isinstance(c, Extend)
                 else self._plan(i, c, self.info.prompt_shares_round)
                 for i, c in enumerate(calls) if not isinstance(c, GrowRound)]
        grows = {i: self._plan_grow(c) for i, c in enumerate(calls) if isinstance(c, GrowRound)}  # refusals first
        before = {c.slot: self.cached_len(c.slot) for c in calls if isinstance(c, Extend)}
        out: list[NumpyLogits | None] = [None] * len(calls)
        if plans:  # a failed _verify leaves every slot as it was
            for plan, logits in zip(plans, self._verify(plans)):
                out[plan.index] = NumpyLogits(np.array(logits.logits))  # [1, V] for an extend (its last row)
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
        """`plan_growth` for one slot, after the checks `Backend.verify_more` makes (nothing touched)."""
        state = self._state(call.slot)
        round_, n = call.round_, call.round_.n
        check_grows(state.round_, state.pending_rows, state.committed + 1, round_, call.first_row)
        if 1 + n > self.info.max_verify_rows:
            raise BackendError(f"slot {call.slot}: round of {1 + n} rows exceeds this backend's limit of "
                               f"{self.info.max_verify_rows}")
        self._check_room(call.slot, state, 1 + n)
        return plan_growth(round_, call.first_row, state.seq_end, self.max_tree_leaves, state.committed)

    def _grow(self, call: GrowRound, leaves: list[tuple[int, int]], member: np.ndarray,
              copies: list[tuple[int, int, int]]) -> NumpyLogits:
        """`Backend.verify_more` on one slot, as `_plan_grow` planned it: rows [first_row, N) on
        top of its provisional tree, each new leaf in the sequence of the old leaf it hangs from
        (which holds its path) or in a free one given its committed prefix and ancestors."""
        state = self._state(call.slot)
        round_, first = call.round_, call.first_row
        self._give_ancestors(call.slot, copies)
        state.seq_end.update({seq: leaf for leaf, seq in leaves})
        state.round_, state.pending_rows = round_, 1 + round_.n  # before the decode: a failure rolls back every row
        part = _Part(call.slot, round_.token_ids[first:], round_.position_ids[first:], member, round_.n - first,
                     state.track)
        try:
            ((logits, hidden),) = self._run([part], "a draft tree's next level")
        except BackendError:
            self.rollback(call.slot)
            raise
        if state.rows_hidden is not None and hidden is not None:
            state.rows_hidden = np.concatenate([state.rows_hidden, hidden])  # [1+N, d]
        return NumpyLogits(logits.copy())  # [M, V]

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
        if local and self._graveyard is not None:  # rejected cells stay held: no holes between accepted cells
            for seq in (0, *leaves):
                llama_cpp.llama_memory_seq_cp(self._mem, main + seq, self._graveyard, t + 1, -1)
            state.dead += state.pending_rows - 1 - k
        for leaf in leaves:  # every other leaf's cells and tags go
            if leaf != local:
                self._seq_rm(main + leaf, -1)
        if local == 0:
            self._seq_rm(main, end)  # a chain's tail past the accepted rows
        else:  # the leaf's sequence holds the prefix, the pending row and the accepted path
            seq = main + local
            self._seq_rm(main, t + 1)  # the main sequence's own candidates (a chain the tree grew from)
            self._seq_rm(seq, end)  # rows below the accepted node, when it is not a leaf
            llama_cpp.llama_memory_seq_cp(self._mem, seq, main, -1, -1)
            self._seq_rm(seq, -1)
        state.committed, state.pending_rows = end, 0
        state.round_, state.seq_end = None, {}
        # the last kept row predicted the new pending token
        state.frontier = None if state.rows_hidden is None else state.rows_hidden[accepted_rows[-1] + 1 if k else 0]
        state.rows_hidden = None

    def rollback(self, slot: int) -> None:
        state = self._state(slot)
        if not state.pending_rows:
            return
        main = self._seq_base(slot)
        for leaf in sorted(set(state.seq_end) - {0}):
            self._seq_rm(main + leaf, -1)
        self._seq_rm(main, state.committed)
        state.pending_rows, state.round_, state.seq_end, state.rows_hidden = 0, None, {}, None

    def truncate(self, slot: int, length: int) -> None:
        self.rollback(slot)
        state = self._state(slot)
        if length < state.committed:
            self._seq_rm(self._seq_base(slot), length)
            state.committed, state.frontier = length, None

    def kv_bytes(self, slot: int | None = None) -> int:
        """Cells in use times bytes per cell (committed + provisional rows: a tree shares its
        slot's prefix cells, so a round adds 1 + N cells whatever its leaf count).  None: every
        open slot (slots share no cell)."""
        slots = self._slots.values() if slot is None else [self._state(slot)]
        return sum(s.committed + s.pending_rows for s in slots) * self.geometry.bytes_per_cell

    # ---- text ------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return tokenize(self.weights.vocab, text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return detokenize(self.weights.vocab, tokens)

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        if not self.weights.chat_template:
            raise BackendError(f"{self.info.checkpoint} has no chat template in its GGUF metadata")
        check_messages(messages)  # before rendering: the refusal names the message, not the rendered text
        vocab = self.weights.vocab
        bos, eos = llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab)
        text = render_chat(self.weights.chat_template, messages, _token_text(vocab, bos), _token_text(vocab, eos))
        return tokenize(vocab, text, add_special=False)  # the template writes its own special tokens


class LlamaCppBackend(HiddenSlotView):
    """A single-sequence `Backend` on llama.cpp: the one slot of a one-slot `LlamaCppBatch`, whose
    verify reads a prompt (`unread`) in decodes of its own; every method forwards to it."""

    batch: LlamaCppBatch

    def __init__(self, batch: LlamaCppBatch) -> None:
        super().__init__(batch, batch.open())

    @classmethod
    def load(cls, model: ResolvedModel, n_threads: int | None = None, n_ctx: int = 4096,
             max_tree_leaves: int = 0, kernels: LlamaCppKernels = DEFAULT_KERNELS) -> LlamaCppBackend:
        """A context of n_ctx cells with a sequence per leaf of trees of up to `max_tree_leaves`
        (`reserve` grows them).  For strict (bit-exact) decoding load through
        `invariance.load_strict`, which also caps the rows a verify may have at what the probe
        measured exact."""
        weights = LlamaCppWeights(model, n_threads, kernels)
        try:
            return cls(LlamaCppBatch(weights, 1, max_tree_leaves, n_ctx, prompt_shares_round=False, owns_weights=True))
        except BaseException:
            weights.free()
            raise

    def close(self) -> None:
        """Free the context and the weights now (with every batch made on them); otherwise they
        go when the backend is collected."""
        self.batch.free()

    @property  # type: ignore[override]
    def info(self) -> BackendInfo:
        return self.batch.info

    @info.setter
    def info(self, info: BackendInfo) -> None:
        self.batch.info = info

    @property
    def kernels(self) -> LlamaCppKernels:
        return self.batch.kernels

    @property
    def geometry(self) -> KvGeometry:
        return self.batch.geometry

    @property
    def max_tree_leaves(self) -> int:
        return self.batch.max_tree_leaves

    def cap_verify_rows(self, rows: int) -> None:
        self.batch.cap_verify_rows(rows)

    extend = DraftSlot.extend
    verify_more = DraftSlot.verify_more


def _pack(plans: list[_Planned], capacity: int) -> list[list[_Planned]]:
    """Whole calls into decodes of at most `capacity` rows, in call order (one when they fit)."""
    groups: list[list[_Planned]] = [[]]
    rows = 0
    for plan in plans:
        if groups[-1] and rows + len(plan.part.tokens) > capacity:
            groups.append([])
            rows = 0
        groups[-1].append(plan)
        rows += len(plan.part.tokens)
    return groups if groups[-1] else []


def _float_rows(pointer, rows: int, width: int) -> np.ndarray:
    """[rows, width] float32 view of a llama.cpp output buffer (valid until its next decode)."""
    values = (ctypes.c_float * (rows * width)).from_address(ctypes.addressof(pointer.contents))
    return np.frombuffer(values, dtype=np.float32).reshape(rows, width)


def _token_text(vocab, token: int) -> str:
    return "" if token < 0 else (llama_cpp.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", "replace")


def gguf_token_weights(path: str, vocab_size: int, n_embd: int) -> TokenWeights:
    """The token embedding and LM head of a GGUF file, dequantized to float32 [V, d] (one array
    when tied: no `output.weight`).  GGUF lists dims fastest first ([d, V]); the reader's arrays
    are row-major [V, ...], which dequantize turns into [V, d]."""
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors if t.name in ("token_embd.weight", "output.weight")}
    if "token_embd.weight" not in tensors:
        raise BackendError(f"{path!r} has no token_embd.weight tensor")

    def read(name: str) -> np.ndarray:
        tensor = tensors[name]
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise BackendError(f"gguf cannot dequantize {name} ({tensor.tensor_type.name}) of {path!r}") from exc
        values = np.ascontiguousarray(values, dtype=np.float32)
        if values.shape != (vocab_size, n_embd):
            raise BackendError(f"{name} of {path!r} reads as {list(values.shape)}, expected [{vocab_size}, {n_embd}]")
        return values

    embed = read("token_embd.weight")
    return TokenWeights(embed, read("output.weight") if "output.weight" in tensors else embed)


def tree_membership(round_: CompiledRound, leaves: Sequence[int]) -> np.ndarray:
    """[1+N, 1+L] bool: is row r (0 = the pending token) in sequence s (0 = the committed
    text, 1 + i = leaf i's)?  The pending token is in every one, candidate row r in those of
    the leaves below it."""
    member = np.zeros((1 + round_.n, 1 + len(leaves)), dtype=bool)
    member[0] = True
    member[1:, 1:] = round_.ancestor_mask[list(leaves)].T  # row r lies on leaf i's path
    return member


def seq_through(round_: CompiledRound | None, seq_end: dict[int, int], accepted_rows: Sequence[int]) -> int:
    """A sequence holding the accepted rows (0 when none is accepted and sequence 0 is the only
    one, or the chain holds them), after checking they form one root path; `seq_end` maps each
    sequence to the candidate row its path ends at."""
    parent = check_path(round_, accepted_rows)
    if parent == -1:
        return 0
    for seq, end in sorted(seq_end.items()):
        if round_.ancestor_mask[end, parent]:
            return seq
    raise AssertionError("every provisional row lies on some sequence's path")


def plan_growth(round_: CompiledRound, first_row: int, seq_end: dict[int, int], max_leaves: int, committed: int,
                ) -> tuple[list[tuple[int, int]], np.ndarray, list[tuple[int, int, int]]]:
    """How a provisional tree grows by rows [first_row, N) (`verify_more`), planned before
    anything is touched (a refusal leaves the round as it was): (new leaf row, its local
    sequence) per new leaf; [M, 1 + max seq] whether each new row lies in each local sequence;
    and the `seq_cp`s (source sequence, new sequence, end) of positions [0, end) that give a new
    leaf's sequence its committed prefix and provisional ancestors (none where the leaf extends
    an old leaf, whose sequence is exactly its path and is reused)."""
    owned = {end: seq for seq, end in seq_end.items() if seq != 0}  # old leaf row -> its sequence
    free = [s for s in range(1, max_leaves + 1) if s not in seq_end]
    leaves: list[tuple[int, int]] = []
    copies: list[tuple[int, int, int]] = []
    for leaf in (leaf for leaf in round_.leaves() if leaf >= first_row):
        anchor = _deepest_ancestor_before(round_, leaf, first_row)
        if anchor in owned:
            leaves.append((leaf, owned.pop(anchor)))
            continue
        if not free:
            raise BackendError(
                f"growing the round to {len(round_.leaves())} leaves needs more sequences than the "
                f"{max_leaves} this context was built for (reserve a larger tree budget first)"
            )
        seq = free.pop(0)
        leaves.append((leaf, seq))
        if anchor == -1:  # hangs from the pending token: sequence 0 holds the prefix and it
            copies.append((0, seq, committed + 1))
        else:
            source = next(s for s, e in seq_end.items() if round_.ancestor_mask[e, anchor])
            copies.append((source, seq, int(round_.position_ids[anchor]) + 1))
    member = np.zeros((round_.n - first_row, 1 + max(seq for _, seq in leaves)), dtype=bool)  # [M, S']
    for leaf, seq in leaves:
        member[:, seq] = round_.ancestor_mask[leaf, first_row:]  # new row r lies on the leaf's path
    return leaves, member, copies


def _deepest_ancestor_before(round_: CompiledRound, row: int, first_row: int) -> int:
    """The deepest ancestor of `row` among rows [0, first_row) (-1 = the pending token)."""
    while row >= first_row:
        row = int(round_.parent[row])
    return row


def _is_chain(round_: CompiledRound) -> bool:
    return bool(np.array_equal(round_.parent, np.arange(-1, round_.n - 1)))


def _kv_geometry(model) -> KvGeometry:
    n_layer = int(llama_cpp.llama_model_n_layer(model))
    n_head = int(llama_cpp.llama_model_n_head(model))
    n_head_kv = int(llama_cpp.llama_model_n_head_kv(model))
    arch = model_meta(model, "general.architecture")
    default_head = int(llama_cpp.llama_model_n_embd(model)) // n_head
    key_len = model_meta(model, f"{arch}.attention.key_length")
    value_len = model_meta(model, f"{arch}.attention.value_length")
    return KvGeometry(
        n_layer=n_layer,
        n_embd_k_gqa=n_head_kv * (int(key_len) if key_len else default_head),
        n_embd_v_gqa=n_head_kv * (int(value_len) if value_len else default_head),
        type_bytes=_KV_TYPE_BYTES,
    )
