"""The small protocol every model backend implements (target and draft alike).

State model: the backend holds committed KV rows for `cached_len` tokens.  A speculative
round calls `verify(pending, round_)`, which evaluates the pending token (at position
`cached_len`) plus every candidate row in ONE forward pass and returns their logits; those
rows are provisional until `commit(accepted_rows)` makes the pending row and the accepted
path authoritative and drops every other row, or `rollback()` drops them all.  The first
round passes the rest of the prompt as `unread`: those rows come before the pending one, are
read in the same call and are committed at once (they are context, not candidates).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

import numpy as np

from draftwise.errors import BackendError
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits

# what a strict target must verify bit-exactly (llama.cpp's strict kernels, measured by the
# invariance probe, `draftwise.measure.invariance`): chains only (a drafter that never branches,
# and plain decoding), or chains and trees
StrictScope = Literal["chains", "trees"]


class ContextOverflow(BackendError):
    """The tokens would not fit the model's context window."""


@dataclass(frozen=True)
class BackendInfo:
    name: str  # "transformers" or "llamacpp"
    checkpoint: str  # file or directory the weights came from, with its hash where known
    tokenizer_hash: str
    vocab_size: int
    context_length: int
    dtype: str
    device: str
    eos_token_ids: frozenset[int]
    max_verify_rows: int = 1 << 30  # largest 1 + N a single verify accepts
    kv_row_bytes: int = 0  # KV cache bytes of one token's row (K and V, every layer); 0 = unknown
    # whether a round's candidate rows ride in the forward that reads the prompt (False: the
    # prompt is read in forwards of its own, and candidates there cost a forward of their own)
    prompt_shares_round: bool = True


class Backend(Protocol):
    info: BackendInfo

    @property
    def cached_len(self) -> int: ...

    @property
    def n_threads(self) -> int:
        """CPU threads the forward passes run on; part of every measured artifact's key."""

    def reserve(self, tree_rows: int) -> None:
        """Size per-branch resources for rounds of up to `tree_rows` branching candidate rows
        (0: chains only).  Called between generations (it may drop the KV cache); the backend
        alone knows what a branch costs it (llama.cpp: a sequence per leaf)."""

    def reset(self) -> None:
        """Drop every KV row."""

    def extend(self, tokens: Sequence[int]) -> TargetLogits:
        """Commit KV rows for `tokens` (appended after cached_len); return logits of the LAST token as row 0."""

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> TargetLogits:
        """Provisionally evaluate pending + candidate rows; logits row 0 = pending, row r + 1 = candidate r.
        `unread` tokens (the prompt, in round 1) are read first and committed: cached_len grows by their count."""

    def verify_more(self, round_: CompiledRound, first_row: int) -> TargetLogits:
        """Evaluate candidate rows [first_row, N) of `round_` on top of the provisional rows of the
        last verify, which evaluated exactly rows [0, first_row) of it (a tree grown by appending
        rows, as a draft model grows its tree level by level).  Logits row i = candidate
        first_row + i; commit and rollback then cover every provisional row, with row indices
        of `round_`."""

    def commit(self, accepted_rows: Sequence[int]) -> None:
        """Keep the pending row and the accepted candidate rows (one root-to-node path); drop the rest."""

    def rollback(self) -> None:
        """Drop every provisional row of the last verify (pending included)."""

    def truncate(self, length: int) -> None:
        """Drop committed rows beyond `length` (draft models re-sync after a rejection)."""

    def kv_bytes(self) -> int:
        """Bytes held by the KV cache now (committed and provisional)."""

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of the model's chat template applied to `messages`, with the assistant turn opened."""


@dataclass(frozen=True, eq=False)
class TokenWeights:
    """The target's token embedding and LM head (float32, [V, d] each; the same array when tied),
    which draft heads read: embeddings of drafted tokens, and the rows of their draft vocabulary."""

    embed: np.ndarray  # [V, d]
    lm_head: np.ndarray  # [V, d]


class HiddenStates(Protocol):
    """The capability draft heads need from a target backend (`supports_hidden`)."""

    def track_hidden(self, on: bool = True) -> None:
        """Keep (or stop keeping) the final-norm hidden state (the LM head's input) of the row
        whose logits predicted the pending token: it comes out of the verify forward that just
        ran, so reading it costs no extra target forward.  Tracking still slows a plain step
        (`benchmarks/llamacpp_hidden/` times it), so the engine switches it off at the start of
        every generation and a proposer that reads it switches it on in `begin`."""

    def frontier_hidden(self) -> np.ndarray | None:
        """[d] float32: the hidden state of committed row cached_len - 1 (None when unknown:
        nothing read yet, or after a truncate)."""

    def token_weights(self) -> TokenWeights: ...


class ContextHidden(Protocol):
    """Hidden states of every committed row, which a layer over the whole context reads (the
    Hydra++ prefix layer, Clover's augmenting block).  They come out of the forwards that
    committed those rows (the prompt's included), so they cost no extra target forward."""

    def track_context(self, on: bool = True) -> None:
        """Keep (or stop keeping) the final-norm state of every row as it is committed; takes
        effect at the next reset (rows committed before it are unknown)."""

    def context_hidden(self, start: int) -> np.ndarray | None:
        """[cached_len - start, d] float32: the states of committed rows start .. cached_len - 1
        (None when some are unknown)."""


def supports_context_hidden(backend: object) -> bool:
    return all(callable(getattr(backend, name, None)) for name in ("track_context", "context_hidden"))


def supports_hidden(backend: object) -> bool:
    return all(callable(getattr(backend, name, None)) for name in ("track_hidden", "frontier_hidden", "token_weights"))


def check_fits(info: BackendInfo, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse, before any generation, a request that cannot fit the context window."""
    need = prompt_tokens + max_new_tokens
    if need > info.context_length:
        raise ContextOverflow(
            f"prompt ({prompt_tokens} tokens) plus max_new_tokens ({max_new_tokens}) needs {need} positions, "
            f"but {info.checkpoint} has a context of {info.context_length}; shorten the prompt or lower max_new_tokens"
        )


def check_grows(provisional: CompiledRound | None, provisional_rows: int, prefix_len: int,
                round_: CompiledRound, first_row: int) -> None:
    """Refuse a `verify_more` whose round does not extend the provisional one row for row
    (`provisional` is the last verify's round, None for a pending-only verify)."""
    if not provisional_rows:
        raise BackendError("verify_more() without a provisional verify")
    have = 0 if provisional is None else provisional.n
    if first_row != have:
        raise BackendError(f"verify_more() from row {first_row}, but {have} candidate rows are provisional")
    if first_row >= round_.n:
        raise BackendError(f"verify_more() with no new rows (round of {round_.n}, first row {first_row})")
    if round_.prefix_len != prefix_len:
        raise BackendError(f"round compiled for prefix_len {round_.prefix_len}, but the pending token sits at {prefix_len - 1}")
    if provisional is not None and not (np.array_equal(round_.token_ids[:have], provisional.token_ids)
                                        and np.array_equal(round_.parent[:have], provisional.parent)):
        raise BackendError("verify_more() round does not begin with the provisional rows (same tokens, same parents)")


def check_path(round_: CompiledRound | None, accepted_rows: Sequence[int]) -> int:
    """Refuse accepted rows that are not one root-to-node path of `round_`; return the last
    accepted row (-1 when none)."""
    parent = -1
    for row in accepted_rows:
        if round_ is None or not 0 <= row < round_.n or round_.parent[row] != parent:
            raise BackendError(f"accepted rows {list(accepted_rows)} are not one root-to-node path of the round")
        parent = int(row)
    return parent


def tokenizer_fingerprint(token_strings: Sequence[str]) -> str:
    """sha256 of the vocabulary in id order: equal for the same tokenizer on every backend."""
    digest = hashlib.sha256()
    for text in token_strings:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()
