"""llama.cpp backend (llama-cpp-python's low-level API): GGUF models at full CPU speed.

Sequences carry the tree.  The context has a unified KV cache (`kv_unified=True`) and
`n_seq_max = max_tree_leaves + 1` sequences, sized by `reserve` from the round limits a decoder
starts with (a context is created with one sequence: chains need no more, and plain decoding
measured ~4% faster with 1 sequence than 65; a larger budget recreates the context between
generations, and nothing above this module knows sequences exist): sequence 0 is the committed text, and in a tree
round leaf i owns sequence i + 1.  Before the batch, `seq_cp(0, s)` tags every committed cell
with each leaf sequence (no data is copied: a unified cache adds the id to the same cells).
The round is ONE llama_batch: the pending token belongs to sequence 0 and to every leaf
sequence, candidate row r to the sequences of the leaves below it.  llama.cpp lets a query
see the cells of its (first) sequence at positions <= its own, i.e. exactly the committed
prefix, the pending token and the row's ancestors: siblings never see each other.

A chain round (and plain decoding, `round_ is None`) lives in sequence 0 alone: the causal
mask is already right, so nothing is copied and nothing has to be undone but a trim.

`verify_more` grows a provisional round (a draft model's tree, level by level): each new
leaf takes over the sequence of the old leaf it hangs from (that sequence already holds its
path) or gets a free one, `seq_cp`'d from a sequence through its deepest provisional ancestor
up to that ancestor's position; the new rows then join their leaves' sequences in one batch.

Commit of a tree keeps the accepted path in sequence 0 and frees every other cell:
`seq_keep(s)` for a leaf s below the accepted node (cells off that path are freed, the rest
keep only s), `seq_rm(s, t + 1 + k, -1)` trims rows below the accepted node, `seq_cp(s, 0)`
and `seq_rm(s)` hand the cells back to sequence 0.  The prefix is never re-evaluated.

Logits come back as a zero-copy view of llama.cpp's output buffer: valid until the next
`extend` or `verify` overwrites it.

Strict kernels (`STRICT_CHAIN_KERNELS` / `STRICT_TREE_KERNELS`, loaded through
`invariance.load_strict`): a decode of one row
gets a throwaway second row (same sequences, one position further, logits on) whose cell is
dropped right after, so that plain steps run the kernels verify batches run; and a tree commit
hands its rejected rows' cells to a graveyard sequence (the last id) instead of freeing them:
llama.cpp refills the lowest free cells first, and a later token in a hole between accepted
cells would put the cache out of position order, which flash attention, summing cells in index
order, would round differently from plain decoding.  The graveyard lives until `reset`, and its
cells count against the context (`_check_room`).

Hidden states (`track_hidden`, for draft heads): every context is created with pooling type
NONE (per-token embeddings) and embeddings off; once tracking, each verify decode runs with embeddings on
(`llama_set_embeddings`, no new context), so llama.cpp also returns the final-norm row of every
output row (the LM head's input), copied beside the logits.  llama.cpp outputs EVERY row of a
batch while embeddings are on, so a prefill keeps them off: the engine's prompt (`unread`) needs
no hidden state, and a tracked `extend` reads all but its last token with embeddings off and
that token alone with them on.  The LM head and token embedding (`token_weights`) are read from
the GGUF file itself (`gguf`, dequantized to float32) once and cached.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, replace
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
)
from draftwise.backends.llamacpp_batch import NumpyBatch
from draftwise.backends.llamacpp_text import detokenize, model_meta, render_chat, tokenize, vocab_texts
from draftwise.backends.base import tokenizer_fingerprint
from draftwise.runtime.text import check_messages
from draftwise.models import ResolvedModel
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import NumpyLogits

_KV_TYPE = llama_cpp.GGML_TYPE_F16  # K and V cache type, fixed so kv_bytes can be computed exactly
_KV_TYPE_BYTES = 2
LLAMACPP_MAX_SEQUENCES = 256  # LLAMA_MAX_SEQ: sequences one llama.cpp context holds (one is the committed text)
_N_BATCH = 512  # tokens per llama_decode (logical and physical batch), llama-cpp-python's default


@dataclass(frozen=True)
class LlamaCppKernels:
    """The kernel choices that decide whether a row verified inside a batch equals the same row
    decoded alone (measured: `draftwise profile --invariance`, benchmarks/llamacpp_exactness/).
    By default it does not, on these CPU kernels, and each cause was isolated by probing:
    - flash attention off: attention's matmuls of a one-row batch use ggml's own dot product,
      two or more rows go to tinyBLAS (another summation order); and a tree row's ancestors sit
      at scattered cache cells, so its dot products over the cells group them into SIMD lanes
      differently from the contiguous cells of plain decoding;
    - flash attention on: one query row's keys are split over the threads (partial sums merged),
      two or more rows are not; masked cells are skipped, so a tree row sums exactly its path;
    - repacked Q4_K weights multiply rows 4 by 4 with a gemm kernel and the rest with a gemv;
      unpacked Q4_K weights switch kernels at 8 rows.
    A last-bit difference then moves a whole 8-bit step where the next layer re-quantizes its
    input, which is how a rounding difference becomes ~0.5-1 in a logit."""

    flash_attn: bool = False  # llama-cpp-python's default
    repack: bool = True  # llama.cpp's interleaved weight layouts (use_extra_bufts), its default
    min_rows: int = 1  # every decode evaluates at least this many rows; throwaway rows pad it
    # a tree commit leaves its rejected rows' cells held (by a graveyard sequence) instead of
    # freeing them: freed cells between accepted ones would be refilled by later tokens, whose
    # cells would then sit out of position order, and flash attention sums cells in index order
    keep_rejected_cells: bool = False

    def describe(self) -> str:
        return (f"flash attention {'on' if self.flash_attn else 'off'}, repacked weights "
                f"{'on' if self.repack else 'off'}, decodes of >= {self.min_rows} row(s)"
                + (", rejected tree cells kept" if self.keep_rejected_cells else ""))


DEFAULT_KERNELS = LlamaCppKernels()
# Strict kernels: rows bit-identical to plain decoding's up to the row count the probe measures
# for the model (which becomes `max_verify_rows`).  Both decode >= 2 rows, so a plain step takes
# a verify's kernels (and, with flash attention, no thread splits one query's keys).
# - for chains: flash attention stays off, so a verify costs what it costs by default (flash
#   attention on these CPU kernels makes an 8-row verify ~1.75x slower); a chain's candidate
#   cells follow the committed ones, so its rows sum the same cells in the same lanes as plain
#   decoding's, but a tree's do not.  `invariance.load_strict` also tries them with unpacked
#   weights (for Q4_K, whose repacked gemm splits rows 4 by 4) and keeps the better measured.
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


class _Handles:
    """The weights and the current context, freed together (the context first).  `dependents`
    are other contexts on the same weights (`llamacpp_multi.LlamaCppBatch`): objects with a
    `free()`, freed before the weights (a context must not outlive its model)."""

    def __init__(self, model, ctx) -> None:
        self.model, self.ctx = model, ctx
        self.dependents: list = []

    def free(self) -> None:
        for dependent in list(self.dependents):
            dependent.free()
        self.dependents.clear()
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def _new_context(model, n_ctx: int, n_seq: int, threads: int, path: str, kernels: LlamaCppKernels,
                 unified: bool = True):
    n_seq += 1 if kernels.keep_rejected_cells else 0  # the graveyard: the last sequence id
    if n_seq > LLAMACPP_MAX_SEQUENCES:
        raise BackendError(f"a tree of {n_seq - 1} leaves needs {n_seq} sequences; a llama.cpp "
                           f"context holds at most {LLAMACPP_MAX_SEQUENCES} (use a narrower tree)")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = _N_BATCH
    cparams.n_ubatch = _N_BATCH
    cparams.n_seq_max = n_seq
    # unified: one cell can belong to many sequences (a tree's prefix is shared, not copied); else
    # one stream of n_ctx / n_seq cells per sequence, each row attending over its own stream only
    cparams.kv_unified = unified
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.type_k = _KV_TYPE
    cparams.type_v = _KV_TYPE
    cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if kernels.flash_attn
                               else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    cparams.embeddings = False  # switched on per decode (llama_set_embeddings) when hidden states are tracked
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if ctx and llama_cpp.llama_pooling_type(ctx) != llama_cpp.LLAMA_POOLING_TYPE_NONE:
        # hidden states are per-token embeddings: pooling NONE, which a causal LM that declares
        # no pooling gets by default (asking for it explicitly makes llama.cpp warn on those)
        llama_cpp.llama_free(ctx)
        cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise BackendError(f"llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seq}) for {path!r}")
    return ctx


class LlamaCppBackend:
    def __init__(self, model, ctx, info: BackendInfo, geometry: KvGeometry, n_threads: int, max_tree_leaves: int,
                 chat_template: str | None, path: str, kernels: LlamaCppKernels = DEFAULT_KERNELS) -> None:
        self._model = model
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.info = info
        self.geometry = geometry
        self.n_threads = n_threads
        self.max_tree_leaves = max_tree_leaves
        self._chat_template = chat_template
        self._path = path
        self.kernels = kernels
        self._n_vocab = info.vocab_size
        self._batch = NumpyBatch(max(_N_BATCH, info.max_verify_rows), max_tree_leaves + 1)
        self._committed = 0  # cells of sequence 0 that are authoritative: positions [0, committed)
        self._dead = 0  # rejected tree rows' cells the graveyard holds (strict kernels), until reset
        self._pending_rows = 0  # provisional rows of the last verify (pending included)
        self._round: CompiledRound | None = None  # the provisional round; None for a pending-only verify
        # sequence -> the candidate row its path ends at: a chain lives in sequence 0, leaf i of a
        # tree in sequence i + 1; every provisional row lies on the path of some sequence
        self._seq_end: dict[int, int] = {}
        self._n_embd = int(llama_cpp.llama_model_n_embd(model))
        self._track = False  # keep hidden states (draft heads read them)
        self._embd_on = False  # the context's llama_set_embeddings flag
        self._rows_hidden: np.ndarray | None = None  # [1 + N, d] of the provisional rows (pending first)
        self._frontier: np.ndarray | None = None  # [d] of committed row cached_len - 1
        self._weights: TokenWeights | None = None  # read from the GGUF on first use
        self._handles = _Handles(model, ctx)
        self._finalizer = weakref.finalize(self, _Handles.free, self._handles)

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def load(cls, model: ResolvedModel, n_threads: int | None = None, n_ctx: int = 4096,
             max_tree_leaves: int = 0, kernels: LlamaCppKernels = DEFAULT_KERNELS) -> "LlamaCppBackend":
        """A context of n_ctx cells shared by max_tree_leaves + 1 sequences (`reserve` grows them).
        For strict (bit-exact) decoding load through `invariance.load_strict`,
        which also caps the rows a verify may have at what the probe measured exact."""
        if model.kind != "gguf":
            raise BackendError(f"the llama.cpp backend loads .gguf files; {model.path!r} is a {model.kind}")
        threads = n_threads or len(os.sched_getaffinity(0))
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = kernels.repack
        handle = llama_cpp.llama_model_load_from_file(model.path.encode(), mparams)
        if not handle:
            raise BackendError(f"llama.cpp could not load {model.path!r}")
        try:
            ctx = _new_context(handle, n_ctx, max_tree_leaves + 1, threads, model.path, kernels)
        except BackendError:
            llama_cpp.llama_model_free(handle)
            raise
        vocab = llama_cpp.llama_model_get_vocab(handle)
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        eos = {int(llama_cpp.llama_vocab_eos(vocab)), int(llama_cpp.llama_vocab_eot(vocab))} - {-1}
        info = BackendInfo(
            name="llamacpp",
            checkpoint=model.checkpoint_id,
            tokenizer_hash=tokenizer_fingerprint(vocab_texts(vocab, n_vocab)),
            vocab_size=n_vocab,
            context_length=int(llama_cpp.llama_n_ctx(ctx)),
            dtype="gguf" if kernels == DEFAULT_KERNELS else f"gguf ({kernels.describe()})",  # keys measured artifacts
            device="cpu",
            eos_token_ids=frozenset(eos),
            max_verify_rows=_N_BATCH,
            kv_row_bytes=_kv_geometry(handle).bytes_per_cell,
            prompt_shares_round=False,  # `verify` reads `unread` in decodes of its own (see there)
        )
        template = model_meta(handle, "tokenizer.chat_template")
        return cls(handle, ctx, info, _kv_geometry(handle), threads, max_tree_leaves, template, model.path, kernels)

    def close(self) -> None:
        """Free the context and the weights now (otherwise when the backend is collected)."""
        self._finalizer()

    def cap_verify_rows(self, rows: int) -> None:
        """Verify at most `rows` rows at once (pending included): the engine caps its rounds at
        this, and a larger round is refused (strict kernels are bit-exact only up to it)."""
        if not 2 <= rows <= _N_BATCH:
            raise BackendError(f"a verify cap must be 2..{_N_BATCH} rows, got {rows}")
        self.info = replace(self.info, max_verify_rows=rows)

    # ---- state ---------------------------------------------------------------------------
    @property
    def cached_len(self) -> int:
        return self._committed

    def reserve(self, tree_rows: int) -> None:
        """Hold a sequence per leaf of rounds of up to `tree_rows` branching rows (a tree never has
        more leaves than rows), recreating the context when it holds fewer; never shrinks.  The
        KV cache is dropped with the old context: call between generations."""
        leaves = min(tree_rows, LLAMACPP_MAX_SEQUENCES - 1)
        if leaves <= self.max_tree_leaves:
            return
        ctx = _new_context(self._model, self.info.context_length, leaves + 1, self.n_threads, self._path, self.kernels)
        llama_cpp.llama_free(self._handles.ctx)
        self._handles.ctx = self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._embd_on = False
        self.max_tree_leaves = leaves
        self._batch = NumpyBatch(max(_N_BATCH, self.info.max_verify_rows), leaves + 1)
        self.reset()

    @property
    def _graveyard(self) -> int | None:
        """The sequence that holds rejected tree cells (strict kernels), else None."""
        return self.max_tree_leaves + 1 if self.kernels.keep_rejected_cells else None

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, False)
        self._committed = 0
        self._dead = 0
        self._pending_rows = 0
        self._round = None
        self._seq_end = {}
        self._rows_hidden = None
        self._frontier = None

    # ---- hidden states (draft heads) ------------------------------------------------------------
    def track_hidden(self, on: bool = True) -> None:
        self._track = on

    def frontier_hidden(self) -> np.ndarray | None:
        return self._frontier

    def token_weights(self) -> TokenWeights:
        if self._weights is None:
            self._weights = gguf_token_weights(self._path, self.info.vocab_size, self._n_embd)
        return self._weights

    def _embeddings(self, on: bool) -> None:
        """Switch the context's embedding output (llama.cpp outputs every row of a batch while on)."""
        if on != self._embd_on:
            llama_cpp.llama_set_embeddings(self._ctx, on)
            self._embd_on = on

    def _hidden_rows(self, rows: int) -> np.ndarray:
        """[rows, d] copy of the last decode's final-norm rows (the buffer is reused by the next decode)."""
        pointer = llama_cpp.llama_get_embeddings(self._ctx)
        if not pointer:
            raise BackendError("llama.cpp returned no embeddings for a decode with embeddings on")
        return np.ctypeslib.as_array(pointer, shape=(rows, self._n_embd)).copy()  # [R, d]

    def _decode(self, what: str) -> None:
        padding = self._batch.pad_to(self.kernels.min_rows)
        code = llama_cpp.llama_decode(self._ctx, self._batch.struct)
        if padding is not None:
            sequences, first, end = padding
            for seq in sequences:  # the pad cells, and only them: nothing of the batch's own rows
                llama_cpp.llama_memory_seq_rm(self._mem, seq, first, end)
        if code != 0:
            raise BackendError(f"llama_decode failed during {what} (code {code}; 1 = no KV slot: n_ctx too small)")

    def _decode_or_drop(self, what: str, t: int) -> None:
        """Decode a sequence-0 batch; on failure drop whatever cells it left past position t."""
        try:
            self._decode(what)
        except BackendError:
            self._seq_rm(0, t)
            raise

    def _logits_view(self, rows: int) -> np.ndarray:
        # re-read the pointer after every decode: llama.cpp may reallocate its output buffer
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(rows, self._n_vocab))  # [R, V]

    def extend(self, tokens: Sequence[int]) -> NumpyLogits:
        return self._extend(tokens, hidden=self._track)

    def _extend(self, tokens: Sequence[int], hidden: bool) -> NumpyLogits:
        """Commit `tokens`; with `hidden`, the last token's final-norm row becomes the frontier
        (that token is decoded alone with embeddings on; the rest with them off, one output)."""
        if self._pending_rows:
            raise BackendError("extend() while a verify is provisional; commit or roll back first")
        if not len(tokens):
            raise BackendError("extend() needs at least one token")
        self._check_room(len(tokens))
        self._frontier = None
        body = tokens[:-1] if hidden else tokens
        chunks = [body[start : start + _N_BATCH] for start in range(0, len(body), _N_BATCH)]
        if hidden:
            chunks.append(tokens[-1:])
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            self._embeddings(hidden and last)
            self._batch.set_sequence(chunk, self._committed, last_logits_only=True)
            try:
                self._decode("extend")
            except BackendError:
                self.truncate(self._committed)  # drop the chunk's partial cells, keep what was committed
                raise
            self._committed += len(chunk)
        if hidden:
            self._frontier = self._hidden_rows(1)[0]
        # a copy: prefill is rare and callers may keep these logits across the next verify
        return NumpyLogits(self._logits_view(1).copy())  # [1, V]

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> NumpyLogits:
        if self._pending_rows:
            raise BackendError("verify() while a previous verify is provisional; commit or roll back first")
        if len(unread):
            # a decode of their own: a prompt may exceed one batch, and on these CPU kernels a
            # row costs about the same inside or outside the round's batch; the prompt's rows
            # need no hidden state (the verify's own rows carry the next one)
            self._extend(unread, hidden=False)
        t = self._committed
        self._embeddings(self._track)
        if round_ is None:
            self._check_room(1)
            self._batch.set_one(int(pending), t)
            self._decode_or_drop("verify", t)
            self._pending_rows = 1
            self._rows_hidden = self._hidden_rows(1) if self._track else None
            return NumpyLogits(self._logits_view(1))  # [1, V]
        n = round_.n
        if 1 + n > self.info.max_verify_rows:
            raise BackendError(f"round of {1 + n} rows exceeds this backend's limit of {self.info.max_verify_rows}")
        if round_.prefix_len != t + 1:
            raise BackendError(f"round compiled for prefix_len {round_.prefix_len}, but the pending token sits at {t}")
        self._check_room(1 + n)
        tokens = np.concatenate([[pending], round_.token_ids])  # [1+N]
        positions = np.concatenate([[t], round_.position_ids])  # [1+N]
        if _is_chain(round_):
            self._batch.set_sequence(tokens, t, last_logits_only=False)
            self._decode_or_drop("verify", t)
            self._round, self._seq_end = round_, ({0: n - 1} if n else {})
        else:
            self._verify_tree(round_, tokens, positions)
        self._pending_rows = 1 + n
        self._rows_hidden = self._hidden_rows(1 + n) if self._track else None
        return NumpyLogits(self._logits_view(1 + n))  # [1+N, V]

    def verify_more(self, round_: CompiledRound, first_row: int) -> NumpyLogits:
        check_grows(self._round, self._pending_rows, self._committed + 1, round_, first_row)
        n, t = round_.n, self._committed
        if 1 + n > self.info.max_verify_rows:
            raise BackendError(f"round of {1 + n} rows exceeds this backend's limit of {self.info.max_verify_rows}")
        self._check_room(1 + n)
        # plan every sequence before touching the cache, so a refusal leaves the round as it was
        leaves, member, copies = plan_growth(round_, first_row, self._seq_end, self.max_tree_leaves, t)
        for source, seq, end in copies:
            llama_cpp.llama_memory_seq_cp(self._mem, source, seq, -1, end)  # positions [0, end)
        self._seq_end.update({seq: leaf for leaf, seq in leaves})
        self._round = round_
        self._pending_rows = 1 + n  # before the decode: a failure below rolls back every provisional row
        self._batch.set_tree(round_.token_ids[first_row:], round_.position_ids[first_row:], member)
        self._embeddings(self._track)
        try:
            self._decode("verify_more")
        except BackendError:
            self.rollback()
            raise
        if self._rows_hidden is not None:
            self._rows_hidden = np.concatenate([self._rows_hidden, self._hidden_rows(n - first_row)])  # [1+N, d]
        return NumpyLogits(self._logits_view(n - first_row))  # [M, V]

    def _verify_tree(self, round_: CompiledRound, tokens: np.ndarray, positions: np.ndarray) -> None:
        leaves = round_.leaves()
        if len(leaves) > self.max_tree_leaves:
            raise BackendError(
                f"round has {len(leaves)} leaves but this context was built for {self.max_tree_leaves} "
                "(reserve a larger tree budget first)"
            )
        member = tree_membership(round_, leaves)  # [1+N, 1+L]
        for s in range(1, 1 + len(leaves)):
            llama_cpp.llama_memory_seq_cp(self._mem, 0, s, -1, -1)
        self._batch.set_tree(tokens, positions, member)
        self._round, self._seq_end = round_, {i + 1: leaf for i, leaf in enumerate(leaves)}
        try:
            self._decode("verify")
        except BackendError:
            self._drop_tree(self._committed)
            raise

    def commit(self, accepted_rows: Sequence[int]) -> None:
        if not self._pending_rows:
            raise BackendError("commit() without a provisional verify")
        t, k = self._committed, len(accepted_rows)
        end = t + 1 + k  # sequence 0 will hold positions [0, end)
        if self._round is None:
            if k:
                raise BackendError(f"accepted rows {list(accepted_rows)}, but the verify had no candidate rows")
            seq = 0
        else:
            seq = self._seq_through(accepted_rows)
        leaves = sorted(set(self._seq_end) - {0})
        if seq == 0:
            if leaves:  # every other sequence's cells and tags go (the rows past the pending one)
                self._keep_only(0, leaves)
            self._seq_rm(0, end)  # sequence 0's rows past the accepted ones (a chain's tail)
        else:
            if self._graveyard is not None:  # the rejected rows' cells stay held: no holes between accepted cells
                for leaf in leaves:
                    llama_cpp.llama_memory_seq_cp(self._mem, leaf, self._graveyard, t + 1, -1)
                self._dead += self._pending_rows - 1 - k
            self._keep_only(seq, leaves)
            self._seq_rm(seq, end)  # rows below the accepted node, when it is not a leaf
            llama_cpp.llama_memory_seq_cp(self._mem, seq, 0, -1, -1)
            self._seq_rm(seq, -1)
        self._committed = end
        self._pending_rows = 0
        self._round, self._seq_end = None, {}
        if self._rows_hidden is not None:  # the last kept row predicted the new pending token
            self._frontier = self._rows_hidden[accepted_rows[-1] + 1 if k else 0]
            self._rows_hidden = None

    def _seq_through(self, accepted_rows: Sequence[int]) -> int:
        return seq_through(self._round, self._seq_end, accepted_rows)

    def rollback(self) -> None:
        if not self._pending_rows:
            return
        if set(self._seq_end) - {0}:
            self._drop_tree(self._committed)
        else:  # pending-only or a chain: sequence 0 alone holds the provisional rows
            self._seq_rm(0, self._committed)
        self._pending_rows = 0
        self._round, self._seq_end = None, {}
        self._rows_hidden = None

    def _keep_only(self, seq: int, leaves: Sequence[int]) -> None:
        """Drop every leaf sequence but `seq` (their cells are freed unless another sequence
        holds them).  llama.cpp's seq_keep would also free the graveyard's cells."""
        if self._graveyard is None:
            llama_cpp.llama_memory_seq_keep(self._mem, seq)
            return
        for leaf in leaves:
            if leaf != seq:
                self._seq_rm(leaf, -1)

    def _drop_tree(self, t: int) -> None:
        self._keep_only(0, sorted(set(self._seq_end) - {0}))  # frees tree cells, strips leaf tags from the prefix
        self._seq_rm(0, t)  # the pending token
        self._round, self._seq_end = None, {}

    def truncate(self, length: int) -> None:
        self.rollback()
        if length < self._committed:
            self._seq_rm(0, length)
            self._committed = length
            self._frontier = None

    def _seq_rm(self, seq: int, start: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, start, -1):
            raise BackendError(f"llama.cpp refused to drop positions >= {start} of sequence {seq} (recurrent model?)")

    def _check_room(self, rows: int) -> None:
        rows = max(rows, self.kernels.min_rows)  # pad rows hold cells while the decode runs
        if self._committed + self._dead + rows > self.info.context_length:
            held = f" + {self._dead} rejected tree cells held (strict)" if self._dead else ""
            raise ContextOverflow(
                f"{self._committed} cached{held} + {rows} new rows exceed the context of {self.info.context_length}"
            )

    def kv_bytes(self) -> int:
        """Cells in use times bytes per cell (cells in use = committed + provisional rows; the
        tree shares the prefix cells, so a round adds 1 + N cells whatever its leaf count)."""
        return (self._committed + self._pending_rows) * self.geometry.bytes_per_cell

    # ---- text ----------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return tokenize(self._vocab, text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return detokenize(self._vocab, tokens)

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        if not self._chat_template:
            raise BackendError(f"{self.info.checkpoint} has no chat template in its GGUF metadata")
        check_messages(messages)  # before rendering: the refusal names the message, not the rendered text
        bos, eos = llama_cpp.llama_vocab_bos(self._vocab), llama_cpp.llama_vocab_eos(self._vocab)
        text = render_chat(self._chat_template, messages, self._token_text(bos), self._token_text(eos))
        return tokenize(self._vocab, text, add_special=False)  # the template writes its own special tokens

    def _token_text(self, token: int) -> str:
        return "" if token < 0 else (llama_cpp.llama_vocab_get_text(self._vocab, token) or b"").decode("utf-8", "replace")


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
