"""The proposer role: a cheap source of candidate tokens with a declared contract.

Two methods carry the work (`propose`, and `observe` for feedback such as adaptive length);
`begin` hands over the generation's sampling policy and generator once, so a sampling
proposer draws from the same policy the verifier applies to the target.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from draftwise.contracts import ProposalResult, ProposerContract
from draftwise.sampling import SamplingPolicy


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

    def observe(self, accepted: int) -> None:
        """Feedback: how many of the last proposal's tokens the verifier accepted."""
