"""A target that follows a recorded trace, so the replay runs through the real engine.

A trace is the target's own plain continuation of a prompt.  Under greedy decoding the
target's next token after any context on that trace IS the trace's next token, and under
sampling a target sample there is distributed as it; so a backend whose every row predicts
the trace, one-hot, stands in for the target for the two verifiers that accept exactly the
target's own tokens (greedy and membership).  Both descend only through children that carry
the token their parent row predicts, i.e. only along the trace: a candidate row whose path
has left the trace is never reached, so its prediction does not matter and is simply the
trace's token at that depth (which keeps every row one vectorized lookup, with no [N, V]
array).  A residual verifier (min(1, p/q)) would read those rows' probabilities, which a
trace does not reveal: the replay never binds one.

Past its end the trace is read as its last token repeated: the replay may run the engine
beyond a trace that ended on a stop string (see `replay.py`) and cuts those rounds off.

The backend holds no KV: `cached_len` counts the positions the engine has committed, and
every token the engine commits or sends as pending is checked against the trace, so a
verifier that accepted a token the target would not have produced is caught at once
(`LeftTheTrace`) instead of silently replaying another text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from draftwise.backends.base import BackendError, BackendInfo, TokenWeights, check_grows, check_path
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import CompiledRound

TRACE_BACKEND = "trace"


class LeftTheTrace(BackendError):
    """The engine committed or sent a token the trace does not hold at that position."""


@dataclass(frozen=True)
class TraceLogits:
    """TargetLogits whose every row is one-hot on a known token: row 0 = pending, row r + 1 = candidate r."""

    next_tokens: np.ndarray  # [1 + N] int64
    vocab_size: int

    def argmax(self) -> np.ndarray:  # [1 + N] int64
        return self.next_tokens

    def probs(self, row: int, policy: SamplingPolicy) -> np.ndarray:  # [V] float64
        # a one-hot distribution stays one-hot under any temperature, top-k or top-p: the policy
        # has nothing to change, and only this row's [V] is ever built
        out = np.zeros(self.vocab_size, dtype=np.float64)
        out[int(self.next_tokens[row])] = 1.0
        return out


def trace_info(sequence: Sequence[int], context_length: int, eos_token_ids: frozenset[int]) -> BackendInfo:
    """What the engine reads of a target, for a trace of `sequence` (prompt + continuation)."""
    return BackendInfo(name=TRACE_BACKEND, checkpoint=TRACE_BACKEND, tokenizer_hash=TRACE_BACKEND,
                       vocab_size=int(max(sequence)) + 1, context_length=context_length, dtype="none",
                       device="none", eos_token_ids=eos_token_ids)


class TraceBackend:
    """A Backend (base.py's protocol) whose target output at position i is sequence[i + 1]."""

    def __init__(self, prompt: Sequence[int], tokens: Sequence[int], context_length: int,
                 eos_token_ids: frozenset[int] = frozenset()) -> None:
        if not prompt or not tokens:
            raise ValueError("a trace backend needs a prompt and at least one generated token")
        self._sequence = np.asarray([*prompt, *tokens], dtype=np.int64)  # [P + T]
        self.info = trace_info(self._sequence.tolist(), context_length, eos_token_ids)
        self._committed = 0
        self._round: CompiledRound | None = None
        self._provisional = 0  # rows of the last verify not yet committed or rolled back (0: none)

    @property
    def cached_len(self) -> int:
        return self._committed

    @property
    def n_threads(self) -> int:
        return 1

    # ---- the trace ---------------------------------------------------------------------------
    def _at(self, positions: np.ndarray) -> np.ndarray:
        """Trace tokens at `positions` [K] (past the end: the last token, see the module note)."""
        return self._sequence[np.minimum(positions, self._sequence.shape[0] - 1)]

    def _check_follows(self, start: int, tokens: Sequence[int], what: str) -> None:
        """Refuse `tokens` placed from position `start` unless they are the trace's own there."""
        if not tokens:
            return
        expected = self._at(np.arange(start, start + len(tokens)))
        if not np.array_equal(expected, np.asarray(tokens, dtype=np.int64)):
            raise LeftTheTrace(f"{what} {list(map(int, tokens))} at position {start}, but the trace holds "
                               f"{expected.tolist()} there: a verifier accepted a token the target would not produce")

    def _predictions(self, pending_at: int, depths: np.ndarray) -> np.ndarray:
        """[K] the trace token after a row at depth `depths` [K] below the pending token (depth 0 =
        the pending row): right for every row on the trace, and never read for the others."""
        return self._at(pending_at + depths + 1)

    # ---- the protocol ------------------------------------------------------------------------
    def reserve(self, tree_rows: int) -> None:
        pass  # no KV: any tree fits

    def reset(self) -> None:
        self._committed, self._round, self._provisional = 0, None, 0

    def extend(self, tokens: Sequence[int]) -> TraceLogits:
        if self._provisional:
            raise BackendError("extend() while a verify is provisional; commit or roll back first")
        if not tokens:
            raise BackendError("extend() needs at least one token")
        self._check_follows(self._committed, tokens, "extended tokens")
        self._committed += len(tokens)
        return TraceLogits(self._predictions(self._committed - 1, np.zeros(1, dtype=np.int64)), self.info.vocab_size)

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> TraceLogits:
        if self._provisional:
            raise BackendError("verify() while a previous verify is provisional; commit or roll back first")
        self._check_follows(self._committed, [*unread, pending], "unread + pending tokens")
        self._committed += len(unread)  # the unread rows are context: committed whatever the round's outcome
        if round_ is not None and round_.prefix_len != self._committed + 1:
            raise BackendError(f"round compiled for prefix_len {round_.prefix_len}, but the pending token sits at "
                               f"{self._committed}")
        depths = np.zeros(1, dtype=np.int64) if round_ is None else np.concatenate([[0], round_.depth])  # [1 + N]
        self._round, self._provisional = round_, 1 + (0 if round_ is None else round_.n)
        return TraceLogits(self._predictions(self._committed, depths), self.info.vocab_size)

    def verify_more(self, round_: CompiledRound, first_row: int) -> TraceLogits:
        check_grows(self._round, self._provisional, self._committed + 1, round_, first_row)
        self._round, self._provisional = round_, 1 + round_.n
        return TraceLogits(self._predictions(self._committed, round_.depth[first_row:]), self.info.vocab_size)

    def commit(self, accepted_rows: Sequence[int]) -> None:
        if not self._provisional:
            raise BackendError("commit() without a provisional verify")
        check_path(self._round, accepted_rows)
        tokens = [] if self._round is None else [int(self._round.token_ids[r]) for r in accepted_rows]
        self._check_follows(self._committed + 1, tokens, "accepted candidates")
        self._committed += 1 + len(tokens)
        self._round, self._provisional = None, 0

    def rollback(self) -> None:
        self._round, self._provisional = None, 0

    def truncate(self, length: int) -> None:
        self.rollback()
        self._committed = min(self._committed, length)

    def kv_bytes(self) -> int:
        return 0  # no KV is held: the rows' cost is predicted from the verify profile instead

    # ---- text: token ids written out, so that stop-string checks and the result's text are defined
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return [int(t) for t in text.split()]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return " ".join(str(int(t)) for t in tokens)

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        raise BackendError("a trace backend has no chat template: it replays a prompt already tokenized")


class HiddenTraceBackend(TraceBackend):
    """A trace backend that also serves the target's hidden states along the trace, so that draft
    heads (which read them: `backends.base.HiddenStates`, `ContextHidden`) can be replayed.

    Under greedy decoding the engine commits exactly the trace's tokens, so the state of every
    committed row is the state the target computed for that trace position, recorded once
    (`optimize/trace_hidden.py`).  `hidden` [R, d] holds the states of positions first ..
    first + R - 1; a row before `first` is unknown (a backend that keeps no context states
    records from the prompt's last row on) and a row past the end reads the last one, like the
    tokens (see the module note).  The identity is the real target's, which heads check."""

    def __init__(self, prompt: Sequence[int], tokens: Sequence[int], context_length: int,
                 eos_token_ids: frozenset[int], *, target: BackendInfo, hidden: np.ndarray, first: int,
                 weights: TokenWeights) -> None:
        super().__init__(prompt, tokens, context_length, eos_token_ids)
        if hidden.ndim != 2 or not 0 <= first < len(prompt) or first + hidden.shape[0] < len(prompt) + len(tokens):
            raise ValueError(f"hidden states [{', '.join(map(str, hidden.shape))}] from position {first} do not cover "
                             f"the trace's {len(prompt)} + {len(tokens)} positions")
        self.info = replace(self.info, checkpoint=target.checkpoint, tokenizer_hash=target.tokenizer_hash,
                            vocab_size=target.vocab_size)
        self._hidden = np.asarray(hidden, dtype=np.float32)  # [R, d]
        self._first = first
        self._weights = weights

    def track_hidden(self, on: bool = True) -> None:
        pass  # recorded once for the whole trace: nothing to switch

    def track_context(self, on: bool = True) -> None:
        pass

    def _states(self, start: int, stop: int) -> np.ndarray | None:
        """[stop - start, d] states of positions start .. stop - 1 (None when one is unknown)."""
        if start < self._first:
            return None
        rows = np.minimum(np.arange(start, stop) - self._first, self._hidden.shape[0] - 1)  # [K]
        return self._hidden[rows]

    def frontier_hidden(self) -> np.ndarray | None:
        if self._committed == 0:
            return None
        states = self._states(self._committed - 1, self._committed)
        return None if states is None else states[0]

    def context_hidden(self, start: int) -> np.ndarray | None:
        if not 0 <= start <= self._committed:
            return None
        return self._states(start, self._committed)

    def token_weights(self) -> TokenWeights:
        return self._weights
