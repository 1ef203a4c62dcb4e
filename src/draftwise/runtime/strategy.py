"""The engine's decisions about a round, behind one interface: the round asks, the strategy answers.

`RoundStrategy` decides, for the requests that share a round, whether each plays speculation or a
plain step (the do-no-harm guard: docs/trees-and-planning.md), whether a round that reads a
prompt carries candidates, how deep every request's gated round is verified when they share one forward (the
batch-aware depth cut), and what shadow proposals count for; it is told what each round
committed and in how many seconds.  Each request's own cost gate and a union's source gate stay
with the request (`runtime.round`): they price that request's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from draftwise.runtime.guard import Arm, DoNoHarm
from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.runtime.gate import rows_within_depths
from draftwise.runtime.round import Ask, Orders, VerifyRequest
from draftwise.runtime.shadow import ShadowOutcome, round_price
from draftwise.topology.compile import CompiledRound, cut_to_depth


@dataclass
class RoundStrategy:
    """Answers a round's questions for every request that shares it.  `harm`: the do-no-harm guard
    (None: always speculate); `profile`: t_B(n) of the target, which prices shadows and, where
    several requests share a forward, cuts their gated rounds to the depth that pays for it;
    `prompt_shares_round`: whether a prompt-reading round's candidates ride in the forward that
    reads the prompt (False: they would cost a forward of their own, so that round is plain)."""

    harm: DoNoHarm | None = None
    profile: BatchCostProfile | None = None
    prompt_shares_round: bool = True
    _arm: Arm = Arm.SPECULATE
    _explored: bool = False
    _steady: bool = False

    # ---- asked -------------------------------------------------------------------------------
    def joined(self, batch: int) -> None:
        """A request joined, making the batch `batch` requests.  Alone, its text is new: the
        guard's estimates carry over as evidence its own rounds soon outweigh (`DoNoHarm.carry_alone`);
        in a running batch, a turnover of its requests re-checks speculation (`DoNoHarm.joined`)."""
        if self.harm is None:
            return
        if batch == 1:
            self.harm.carry_alone()
        else:
            self.harm.joined(batch)

    def start(self, batch: int, reading_prompts: bool) -> None:
        """A round of `batch` requests begins.  Only steady rounds are priced (no request reads its
        prompt in them); the others still play the chosen arm."""
        self._steady = self.harm is not None and not reading_prompts
        if self.harm is None:
            self._arm, self._explored = Arm.SPECULATE, False
        elif self._steady:
            self._arm, self._explored = self.harm.play(batch)
        else:
            self._arm, self._explored = self.harm.chosen(batch), False

    def orders(self, ask: Ask, batch: int) -> Orders:
        """How a request plays this round.  A round that reads a prompt carries candidates where
        they ride in its forward, unless the guard chose plain on measured rounds; in a batch only
        where speculation measured to pay there (several prompts in one forward are no longer
        nearly free)."""
        shadows = None if self.harm is None else self.harm.shadow_share(batch)
        if not ask.reads_prompt:
            return Orders(self._arm, batch, shadows, guard_plain=self.harm is not None and self._arm is Arm.PLAIN)
        if not self.prompt_shares_round:
            return Orders(Arm.PLAIN, batch, shadows)
        if self.harm is None:
            return Orders(Arm.SPECULATE, batch, shadows)
        speculate = self.harm.prompt_arm(1) is Arm.SPECULATE if batch == 1 else self.harm.proven(batch)
        return Orders(Arm.SPECULATE if speculate else Arm.PLAIN, batch, shadows, guard_plain=not speculate)

    def cuts(self, waiting: Sequence[tuple[int, VerifyRequest]]) -> dict[int, CompiledRound]:
        """Request id -> its round cut to the one depth D that maximizes the forward's committed
        tokens per second, sum_i (1 + E_i[accepted | D]) / t_B(1 + max_i rows_i(D)), for the
        gated requests whose round it cuts.  A shared forward is as wide as its widest request."""
        gated = [(i, v) for i, v in waiting if v.expected is not None and v.round_ is not None and not v.unread]
        if self.profile is None or len(waiting) < 2 or not gated or self._arm is Arm.PLAIN:
            return {}
        profile = self.profile.at(len(waiting))
        gated_ids = {i for i, _ in gated}
        # the rows of the requests it does not cut (prompt calls are read in forwards of their own)
        others = max((v.round_.n for i, v in waiting if i not in gated_ids and v.round_ is not None and not v.unread),
                     default=0)
        shapes = []
        for i, v in gated:
            assert v.round_ is not None and v.expected is not None
            shapes.append((i, v.round_, rows_within_depths(v.round_, len(v.expected) - 1), v.expected))
        best_depth, best_rate = 0, -1.0
        for depth in range(max(len(expected) for *_, expected in shapes)):
            rows = 1 + max(others, *(within[min(depth, len(within) - 1)] for _, _, within, _ in shapes))
            if rows > profile.max_rows:
                break
            tokens = sum(1.0 + expected[min(depth, len(expected) - 1)] for *_, expected in shapes)
            rate = tokens / profile.relative_at(rows)
            if rate > best_rate:  # ties go to the shallower round
                best_depth, best_rate = depth, rate
        return {i: cut_to_depth(round_, best_depth) for i, round_, _, expected in shapes if best_depth < len(expected) - 1}

    # ---- told --------------------------------------------------------------------------------
    def observe(self, batch: int, tokens: int, seconds: float, shadows: Sequence[ShadowOutcome],
                retried: bool) -> None:
        """A round of `batch` requests committed `tokens` in `seconds` (its proposals and draft
        steps included); `shadows` are what the shadow proposals its tokens decided would have
        committed.  A round whose shared forward failed and was retried request by request is
        not a measurement of either arm."""
        if self.harm is None or not self._steady or retried:
            return
        for outcome in shadows:
            self.harm.shadow(batch, [outcome.committed], self.shadow_price(outcome, batch))
        self.harm.observe(batch, self._arm, tokens, seconds, self._explored)

    def shadow_price(self, outcome: ShadowOutcome, batch: int) -> float | None:
        """Seconds of the speculative round a shadow stands for: every request's proposal plus a
        plain round scaled by the measured t_B(1 + rows) / t_B(1).  Without a profile, once a
        speculative round was measured, an empty proposal costs a plain round and the proposals
        themselves, and a proposal with rows the mean measured speculative round (None); before
        that, no shadow is priced (empty ones alone would make speculation look worse than it
        is).  Pricing each shadow by its own rows matters where rows are dear: long proposals must
        not make empty ones look like full-price speculative rounds, nor the reverse."""
        assert self.harm is not None
        plain = self.harm.mean_seconds(batch, Arm.PLAIN)
        if plain <= 0:
            return None
        if self.profile is not None:
            return round_price(outcome, plain, self.profile.at(batch), requests=batch)
        if outcome.rows or self.harm.mean_seconds(batch, Arm.SPECULATE) <= 0:
            return None
        return batch * outcome.cost + plain


def alone(profile: VerifyCostProfile | None) -> BatchCostProfile | None:
    """A lone request's t(n) as the batch profile of one request."""
    return None if profile is None else BatchCostProfile({1: profile})
