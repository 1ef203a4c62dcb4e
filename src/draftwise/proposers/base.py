"""The proposer role: a cheap source of candidate tokens with a declared contract.

Two methods carry the work: `propose`, and `observe`, which hands back what the verifier
decided about the proposal (the accepted nodes and the published tokens) so a proposer with
state of its own (a draft model's KV cache, a head's hidden-state input, a shallow-layer
cache) commits the accepted part and rolls back the rest with the round.  `begin` hands over
the generation's sampling policy and generator once, so a sampling proposer draws from the
same policy the verifier applies to the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from draftwise.contracts import ProposalResult, ProposerContract
from draftwise.sampling import SamplingPolicy


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
