"""The proposer role: a cheap source of candidate tokens with a declared contract.

Two methods carry the work: `propose`, and `observe`, which hands back what the verifier
decided about the proposal (the accepted nodes and the published tokens) so a proposer with
state of its own (a draft model's KV cache, a head's hidden-state input, a shallow-layer
cache) commits the accepted part and rolls back the rest with the round.  `begin` hands over
the generation's sampling policy and generator once, so a sampling proposer draws from the
same policy the verifier applies to the target.

A proposer that runs a model may also draft in steps (`SteppedProposer.drafting`): a generator
that yields a `DraftRequest` wherever it needs its model's forward and is sent the answer.  The
engine's round passes these requests up, so the engine (`draftwise.runtime.engine`) answers every request's
step with ONE call of the shared model (`Drafter.draft_many`), and a request decoded alone
answers each at once (`answer_alone`).  `propose` is the same drafting answered inline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np

from draftwise.runtime.contracts import ProposalResult, ProposerContract
from draftwise.runtime.sampling import SamplingPolicy


@dataclass(frozen=True, eq=False)
class RoundFeedback:
    """What one round decided about one proposer's proposal."""

    result: ProposalResult  # the proposal as returned (its `state` handle included)
    accepted: tuple[int, ...]  # indices into result.nodes on the accepted path, root first
    published: tuple[int, ...]  # tokens published this round: accepted, then the target's own (stop rules applied)


class Proposer(Protocol):
    name: str
    contract: ProposerContract
    # the ledger phase its time goes to: "propose", or "retrieval" for a datastore lookup
    phase: str

    def identity(self) -> dict[str, Any]:
        """What the round manifest records about this proposer (artifacts, hashes, settings)."""

    def begin(self, policy: SamplingPolicy, rng: np.random.Generator) -> None:
        """Start a new generation (drop any state from an earlier one)."""

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        """Candidates continuing `context` (committed tokens; its last token is the pending one).
        `max_depth`: the deepest candidate this round can still verify (the compiler cuts the
        rest); a proposer that pays per depth, such as a draft model, stops there."""

    def observe(self, feedback: RoundFeedback) -> None:
        """The round's outcome for the last proposal: keep state for the accepted path, drop the rest."""


class Drafter(Protocol):
    """A proposer's model that answers draft steps of many requests in one call."""

    def draft_many(self, calls: Sequence[Any]) -> Sequence[Any]:
        """The answer to every call, in order (each call is one request's input for this step)."""


@dataclass(frozen=True, eq=False)
class DraftRequest:
    """One request's draft step, stopped where it needs the model: a batch answers the steps of
    every request with an equal `key` in one `drafter.draft_many` (equal keys promise the same
    model and weights, so any member's `drafter` may answer them all)."""

    key: Hashable
    drafter: Drafter
    call: Any


def answer_alone(request: DraftRequest) -> Any:
    """The draft step of a request decoded alone: its own drafter, at once."""
    (answer,) = request.drafter.draft_many([request.call])
    return answer


@runtime_checkable
class SteppedProposer(Protocol):
    """A proposer whose drafting yields each model forward as a `DraftRequest`."""

    def drafting(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None,
                 ) -> Generator[DraftRequest, Any, ProposalResult]:
        """`Proposer.propose` as a generator: yields its draft steps, returns the proposal."""


def propose_alone(steps: Generator[DraftRequest, Any, ProposalResult]) -> ProposalResult:
    """Run a drafting generator to its proposal, answering every step at once (a step that
    fails is raised inside the generator, whose `finally` rolls its model back)."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            request = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            result: ProposalResult = done.value
            return result
        try:
            answer, error = answer_alone(request), None
        except Exception as exc:
            answer, error = None, exc


@runtime_checkable
class HoldsResources(Protocol):
    """A proposer holding something of its own beyond a generation (a batch's draft slot)."""

    def close(self) -> None:
        """Free it; the proposer is not used again."""
