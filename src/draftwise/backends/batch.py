"""Many requests on one loaded model: slots whose KV is their own, verified in ONE forward.

A `BatchBackend` holds up to `max_slots` independent sequences (slots).  Each slot follows the
single-sequence state model of `draftwise.backends.base`: committed KV rows for `cached_len(slot)`
tokens, a provisional verify that `commit(slot, rows)` or `rollback(slot)` settles.  What is new
is `verify_many`: the pending and candidate rows of every call (each for its own slot) are
evaluated in one forward pass, and no row ever attends to a row of another slot (the linearized
batch's `origin_request`, `draftwise.runtime.engine.SharedForward`, tells whose each row is; the backend's
mask follows it).

`SlotView` turns one slot into a `Backend`, so that everything written for one sequence (the
engine's round, the proposers that read the target) runs on a slot unchanged: its `verify` is a
forward of that slot alone, and the engine (`draftwise.runtime.engine`) instead collects every
request's `VerifyCall` and makes one `verify_many`.  Slots open and close between rounds (a
closed slot's KV is freed at once, and a reopened slot starts empty: nothing of an earlier
request is visible to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


import numpy as np

from draftwise.backends.base import Backend, BackendInfo, TokenWeights
from draftwise.errors import BackendError
from draftwise.runtime.logits import TargetLogits
from draftwise.topology.compile import CompiledRound


@dataclass(frozen=True)
class VerifyCall:
    """One request's rows in a shared forward: what `Backend.verify` takes, for `slot`."""

    slot: int
    pending: int
    round_: CompiledRound | None
    unread: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        """Rows this call adds to the forward: unread + pending + candidates."""
        return len(self.unread) + 1 + (0 if self.round_ is None else self.round_.n)


@dataclass(frozen=True)
class Extend:
    """`Backend.extend(tokens)` on `slot`: the tokens appended and committed; logits of the last."""

    slot: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class GrowRound:
    """`Backend.verify_more(round_, first_row)` on `slot`: candidate rows [first_row, N) on top of
    the slot's provisional rows (a draft tree's next level)."""

    slot: int
    round_: CompiledRound
    first_row: int


# a draft model's forward for one request; a tree's first verify is a `VerifyCall`
DraftCall = Extend | VerifyCall | GrowRound


def draft_alone(backend: Backend, call: DraftCall) -> TargetLogits:
    """A draft call answered on one sequence's backend (a request decoded alone)."""
    if isinstance(call, Extend):
        return backend.extend(list(call.tokens))
    if isinstance(call, GrowRound):
        return backend.verify_more(call.round_, call.first_row)
    return backend.verify(call.pending, call.round_, call.unread)


def check_calls(calls: Sequence[VerifyCall], open_slots: Sequence[int], max_rows: int) -> None:
    """Refuse a batch that names a slot twice or a slot that is not open, or a call over the row limit."""
    seen: set[int] = set()
    for call in calls:
        if call.slot not in open_slots:
            raise BackendError(f"slot {call.slot} is not open")
        if call.slot in seen:
            raise BackendError(f"slot {call.slot} appears twice in one forward")
        seen.add(call.slot)
        if call.rows - len(call.unread) > max_rows:
            raise BackendError(f"round of {call.rows - len(call.unread)} rows exceeds this backend's limit of {max_rows}")


class BatchBackend(Protocol):
    info: BackendInfo

    @property
    def max_slots(self) -> int:
        """How many slots may be open at once."""

    @property
    def n_threads(self) -> int: ...

    def open(self) -> int:
        """A new, empty slot (its id); BackendError when `max_slots` are open."""

    def close(self, slot: int) -> None:
        """Free the slot's KV now (its provisional rows too); the id may be reused, empty."""

    def open_slots(self) -> tuple[int, ...]: ...

    def cached_len(self, slot: int) -> int: ...

    def reserve(self, slot: int, tree_rows: int) -> None:
        """As `Backend.reserve`, for one slot (between its generations)."""

    def reset(self, slot: int) -> None:
        """Drop every KV row of the slot."""

    def verify_many(self, calls: Sequence[VerifyCall]) -> Sequence[TargetLogits]:
        """ONE forward over every call's rows (distinct open slots, none provisional); logits per
        call as `Backend.verify` returns them (row 0 = pending, row r + 1 = candidate r).  Each
        slot's rows see that slot's committed prefix, its own unread rows and its own ancestors
        only.  A forward that fails leaves every slot as it was."""

    def commit(self, slot: int, accepted_rows: Sequence[int]) -> None: ...

    def rollback(self, slot: int) -> None: ...

    def truncate(self, slot: int, length: int) -> None: ...

    def kv_bytes(self, slot: int | None = None) -> int:
        """Bytes the KV cache holds for `slot` (None: every slot, with whatever is shared or padded)."""

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]: ...


class SlotView:
    """One slot of a `BatchBackend` as a single-sequence `Backend`."""

    def __init__(self, batch: BatchBackend, slot: int) -> None:
        self.batch = batch
        self.slot = slot
        self.info = batch.info

    @property
    def cached_len(self) -> int:
        return self.batch.cached_len(self.slot)

    @property
    def n_threads(self) -> int:
        return self.batch.n_threads

    def reserve(self, tree_rows: int) -> None:
        self.batch.reserve(self.slot, tree_rows)

    def reset(self) -> None:
        self.batch.reset(self.slot)

    def extend(self, tokens: Sequence[int]) -> TargetLogits:
        raise BackendError("a batch slot is a target: it verifies rounds and is never extended")

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> TargetLogits:
        (logits,) = self.batch.verify_many([VerifyCall(self.slot, int(pending), round_, tuple(int(t) for t in unread))])
        return logits

    def verify_more(self, round_: CompiledRound, first_row: int) -> TargetLogits:
        raise BackendError("a batch slot verifies a round in one call (verify_more is a draft model's)")

    def commit(self, accepted_rows: Sequence[int]) -> None:
        self.batch.commit(self.slot, accepted_rows)

    def rollback(self) -> None:
        self.batch.rollback(self.slot)

    def truncate(self, length: int) -> None:
        self.batch.truncate(self.slot, length)

    def kv_bytes(self) -> int:
        return self.batch.kv_bytes(self.slot)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.batch.tokenize(text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.batch.detokenize(tokens)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.batch.chat_prompt(messages)

    def close(self) -> None:
        self.batch.close(self.slot)


class DraftBatch(BatchBackend, Protocol):
    """A batch backend that also runs a draft model's steps for many requests at once."""

    def draft_many(self, calls: Sequence[DraftCall]) -> Sequence[TargetLogits]:
        """Every call (distinct open slots) in ONE forward where they are short (long extends, a
        prompt read in round 1, in a forward each); logits per call as `draft_alone` returns them.
        A forward that fails leaves every slot as it was."""


class DraftSlot(SlotView):
    """One slot of a `DraftBatch` as a draft model's `Backend` (extend and verify_more included):
    a request's own draft KV on weights that every request shares."""

    batch: DraftBatch

    def __init__(self, batch: DraftBatch, slot: int) -> None:
        super().__init__(batch, slot)

    def extend(self, tokens: Sequence[int]) -> TargetLogits:
        return self.batch.draft_many([Extend(self.slot, tuple(int(t) for t in tokens))])[0]

    def verify_more(self, round_: CompiledRound, first_row: int) -> TargetLogits:
        return self.batch.draft_many([GrowRound(self.slot, round_, first_row)])[0]


class HiddenSlotView(SlotView):
    """A slot of a batch backend that keeps hidden states per slot (transformers): what a draft
    head reads (`backends.base.supports_hidden`), the frontier row's state of this slot alone."""

    def track_hidden(self, on: bool = True) -> None:
        self.batch.track_hidden(self.slot, on)  # type: ignore[attr-defined]

    def frontier_hidden(self) -> np.ndarray | None:
        return self.batch.frontier_hidden(self.slot)  # type: ignore[attr-defined, no-any-return]

    def token_weights(self) -> TokenWeights:
        return self.batch.token_weights()  # type: ignore[attr-defined, no-any-return]


def keeps_hidden(batch: BatchBackend) -> bool:
    """Whether the batch backend keeps hidden states per slot (draft heads can run on its slots)."""
    return all(callable(getattr(batch, name, None)) for name in ("track_hidden", "frontier_hidden", "token_weights"))


def slot_view(batch: BatchBackend, slot: int) -> SlotView:
    """The slot as a `Backend`: with the hidden-state methods where the batch keeps them."""
    return HiddenSlotView(batch, slot) if keeps_hidden(batch) else SlotView(batch, slot)
