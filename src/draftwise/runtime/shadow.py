"""Shadow proposals: what a speculative round would have committed, read off plain rounds.

While the do-no-harm guard (`draftwise.runtime.guard`) plays plain steps, a proposer that reads
only the context and the target's committed state (`proposes_without_state`) may still propose.
Under a verifier that accepts a row exactly when its token is the one the target publishes there
(greedy, target-sample membership), plain decoding publishes the very tokens a speculative round
would have been judged by, so `ShadowRounds.resolve` walks each proposal down them and returns
what that round would have committed (accepted + the target's own token).  A shadow proposal is
never verified, committed or shown to a proposer's `observe`: it changes no output.  `due` keeps
its cost (propose + compile) within a share of a plain round's time.  Why the guard needs them:
docs/trees-and-planning.md, "Shadow proposals" (the guard's rounds come too rarely to follow a
bursty proposer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.topology.compile import CompiledRound
from draftwise.verify.base import child_with_token


@dataclass(frozen=True)
class _Pending:
    start: int  # published tokens before the round it was proposed in: its depth-1 rows face token `start`
    round_: CompiledRound
    cost: float  # seconds its proposal took


@dataclass(frozen=True)
class ShadowOutcome:
    """What the speculative round a shadow stands for would have done: committed tokens
    (accepted rows + the target's own), the candidate rows it would have verified, and the
    seconds its proposal took."""

    committed: int
    rows: int
    cost: float


def accepted_along(round_: CompiledRound, published: Sequence[int], start: int = 0) -> int | None:
    """How many of `round_`'s rows a greedy or membership verifier accepts where the target's
    tokens are `published[start:]` (from depth 1 on); None while they are too few to tell."""
    parent, accepted = -1, 0
    while round_.children_of(parent):
        if start + accepted >= len(published):
            return None
        match = child_with_token(round_, parent, published[start + accepted])
        if match is None:
            return accepted
        parent, accepted = match, accepted + 1
    return accepted  # a leaf: the whole path was accepted


def round_price(outcome: ShadowOutcome, plain_seconds: float, profile: VerifyCostProfile, requests: int = 1) -> float:
    """Seconds of the speculative round a shadow stands for, where a plain round takes
    `plain_seconds`: every request's proposal plus the plain round scaled by the measured
    t(1 + rows) / t(1) (`requests` > 1: a batch round where each request verifies that many rows;
    no more rows than the profile measured, which is all a gate lets through)."""
    rows = min(1 + outcome.rows, profile.max_rows)
    return requests * outcome.cost + plain_seconds * profile.relative_at(rows) / profile.relative_at(1)


@dataclass
class ShadowRounds:
    """Pending shadow proposals of one generation, and their spacing."""

    budget: float  # the share of a plain round's time that shadow proposals may take
    _pending: list[_Pending] = field(default_factory=list)
    _wait: int = 0  # plain rounds still to skip before the next shadow

    def due(self) -> bool:
        """Whether this plain round should carry a shadow proposal (counts the round)."""
        if self._wait > 0:
            self._wait -= 1
            return False
        return True

    def track(self, start: int, round_: CompiledRound, cost: float, plain_seconds: float,
              budget: float | None = None) -> None:
        """A shadow proposal made before the round that publishes token `start` (an empty one
        too: a speculative round there would have been a plain step that paid for proposing);
        `cost` its seconds, `plain_seconds` a plain round's: the next shadows wait so that they
        stay within the budget (`budget`, a share of a plain round's time, where given, else `self.budget`)."""
        self._pending.append(_Pending(start, round_, cost))
        if plain_seconds > 0 and cost > 0:
            share = self.budget if budget is None else budget
            self._wait = max(0, math.ceil(cost / (share * plain_seconds)) - 1)

    def resolve(self, published: Sequence[int]) -> list[ShadowOutcome]:
        """The outcome of each pending proposal that `published` now decides; the rest stay pending."""
        decided, still = [], []
        for pending in self._pending:
            accepted = accepted_along(pending.round_, published, pending.start)
            if accepted is None:
                still.append(pending)
            else:
                decided.append(ShadowOutcome(accepted + 1, pending.round_.n, pending.cost))
        self._pending = still
        return decided
