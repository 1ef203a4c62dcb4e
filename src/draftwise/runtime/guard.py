"""Do no harm across a batch: speculate only while it measurably commits more tokens per second.

The gate prices rows by a profile taken on equal prefixes; a live batch is not that regime (slots
of different lengths, requests joining and leaving, prompt lookup's value changing within one
answer), and a price wrong toward "rows are cheap" makes speculation slower than plain batched
decoding.  `DoNoHarm` chooses, per batch size, between two arms from what the rounds themselves
measured (`SPECULATE`: the rounds as the gates chose them; `PLAIN`: every round cut to depth 0):
it plays the arm that commits more tokens per second and explores the other on an interval that
doubles while the choice holds.  The bound it keeps: once both arms' estimates are within a
factor (1 + e) of the truth, its throughput is at least
    r_best * (1 - (1 - r_worse / r_best) / explore_every) / (1 + e).
Why it is built this way (the estimates, warm-up, side costs, shadow rounds, the bound and what
it does not cover): docs/trees-and-planning.md, "The guard's reasoning and its loss bound".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from draftwise.errors import InputError


class Arm(Enum):
    SPECULATE = "speculate"
    PLAIN = "plain"

    @property
    def other(self) -> "Arm":
        return Arm.PLAIN if self is Arm.SPECULATE else Arm.SPECULATE


@dataclass(frozen=True)
class DoNoHarmConfig:
    explore_every: int = 8  # the shortest interval between rounds of the arm not chosen
    max_interval: int = 128  # the longest, after explorations that keep confirming the choice
    warmup: int = 2  # rounds of each arm at a new batch size before comparing them
    # weight of an arm's past per round of its own (its estimate spans about 1/(1 - decay) of its
    # rounds): long, because prompt lookup's rounds commit one token or a whole copied run, and a
    # short memory reads a streak of misses as a losing arm (benchmarks/do_no_harm/)
    decay: float = 0.97
    # weight of an arm's past per round of the OTHER arm: how fast what it did becomes stale
    stale: float = 0.99
    explore_rounds: int = 1  # consecutive rounds of the other arm per exploration
    # share of a plain round's time its shadow proposal may take (`draftwise.runtime.shadow`): a cheap
    # proposer (prompt lookup) shadows every round, a costly one (draft heads) every few rounds
    shadow_budget: float = 0.02
    # in a batch (B > 1), SPECULATE is chosen only where its rounds measured this much faster than
    # plain rounds: speculation has costs its own rounds do not see.  Requests that commit at
    # different rates stop joining together, and a prompt read in a forward of its own (with the
    # others' rows) costs more per row than prompts read together, so a batch whose rounds
    # measured speculation a little faster ran slower end to end (benchmarks/batch_throughput/,
    # "Prompt reads and the margin")
    batch_margin: float = 0.03
    # shadows take their whole budget while speculation's estimate is within this share of plain's;
    # further behind, a share of it in proportion (`DoNoHarm.shadow_share`): one shadow cannot
    # flip a choice that far behind unless it commits many tokens, which a sparser one sees too
    shadow_close: float = 0.05

    def __post_init__(self) -> None:
        if self.warmup < 1 or self.explore_every < 2 or self.max_interval < self.explore_every:
            raise InputError(f"do-no-harm needs warmup >= 1 and 2 <= explore_every <= max_interval, got {self}")
        if not (0.0 <= self.decay < 1.0 and 0.0 <= self.stale <= 1.0):
            raise InputError(f"do-no-harm needs decay in [0, 1) and stale in [0, 1], got {self}")
        if not 1 <= self.explore_rounds < self.explore_every:
            raise InputError(f"do-no-harm needs 1 <= explore_rounds < explore_every, got {self}")
        if not 0.0 < self.shadow_budget <= 1.0:
            raise InputError(f"do-no-harm needs shadow_budget in (0, 1], got {self}")
        if not 0.0 <= self.batch_margin < 1.0:
            raise InputError(f"do-no-harm needs batch_margin in [0, 1), got {self}")
        if not 0.0 < self.shadow_close <= 1.0:
            raise InputError(f"do-no-harm needs shadow_close in (0, 1], got {self}")


@dataclass
class _Rate:
    """Exponentially weighted committed tokens and seconds of one arm at one batch size.  The
    weights decay with every round at that batch size, played on either arm: an arm explored
    after 16 rounds of the other is judged by what it does now, not by what it did then."""

    tokens: float = 0.0
    seconds: float = 0.0
    rounds: int = 0
    last: int = 0  # the batch size's round count when this arm was last played
    weight: float = 0.0  # the rounds the sums hold, each weighted as they are
    shadowed: int = 0  # shadow rounds counted (`DoNoHarm.shadow`): evidence, not played

    def add(self, tokens: float, seconds: float, config: DoNoHarmConfig, now: int, weight: float | None = None) -> None:
        """One played round's evidence at round `now`, or (`weight` given) a shadow round's: not
        played, counted as `weight` rounds' worth of evidence."""
        past = 0.0 if self.weight == 0 else config.decay * config.stale ** max(0, now - self.last - 1)
        share = 1.0 if weight is None else weight
        self.tokens = past * self.tokens + share * tokens
        self.seconds = past * self.seconds + share * seconds
        self.weight = past * self.weight + share
        self.rounds += weight is None
        self.shadowed += weight is not None
        self.last = now

    @property
    def evidence(self) -> int:
        """Rounds this estimate stands on: played, or read off shadow proposals."""
        return self.rounds + self.shadowed

    @property
    def mean_seconds(self) -> float:
        """The weighted mean wall time of this arm's rounds (0.0 before any)."""
        return self.seconds / self.weight if self.weight > 0 else 0.0

    def carried(self, rounds: int) -> "_Rate":
        """This estimate as `rounds` rounds' worth of evidence at another batch size."""
        scale = rounds / self.weight if self.weight > 0 else 0.0
        return _Rate(self.tokens * scale, self.seconds * scale, rounds, 0, float(rounds))

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _BatchState:
    rates: dict[Arm, _Rate]
    choice: Arm
    interval: int
    since_explore: int = 0
    clock: int = 0  # rounds observed at this batch size
    burst: int = 0  # exploration rounds still to play in the current exploration
    turnover: float = 0.0  # the share of the batch that joined since the other arm was last played
    shadows: int = 0  # shadow rounds of SPECULATE counted (`DoNoHarm.shadow`)
    last: Arm | None = None  # the arm of the last round observed at this batch size

    def carried(self, config: DoNoHarmConfig) -> "_BatchState":
        """This state's choice and both arms' estimates as `config.warmup` rounds' worth of evidence,
        for another batch size or a decoder's next request.  The same proposers: where they
        shadowed, they shadow there too, so a carried plain choice is checked by shadows rather
        than by a speculative round."""
        state = _BatchState({arm: rate.carried(config.warmup) for arm, rate in self.rates.items()},
                            self.choice, config.explore_every)
        state.shadows = min(self.shadows, 1)
        return state

    def warming(self, warmup: int) -> bool:
        """Whether an arm has fewer than `warmup` rounds of evidence at this batch size (played, or
        for speculation also shadow rounds)."""
        return any(rate.evidence < warmup for rate in self.rates.values())


@dataclass(frozen=True)
class ArmRound:
    """One counted round: its batch size, the arm played, and what it committed in how long."""

    batch: int
    arm: Arm
    tokens: int
    seconds: float
    explored: bool


@dataclass
class DoNoHarm:
    """The per-batch-size arm choice; `play(batch)` before a round, `observe(...)` after it."""

    config: DoNoHarmConfig = field(default_factory=DoNoHarmConfig)
    ledger: list[ArmRound] = field(default_factory=list)
    _states: dict[int, _BatchState] = field(default_factory=dict)

    def carry_alone(self) -> None:
        """A request starts alone on an engine that held none: its text is new.  The
        batch-1 choice and both arms' estimates carry over as `warmup` rounds' worth of evidence
        (no warm-up rounds, the next exploration after `explore_every`); fresh (warm-up first)
        where both arms had not been measured."""
        state = self._states.get(1)
        if state is None:
            return
        if state.warming(self.config.warmup):
            del self._states[1]
        else:
            self._states[1] = state.carried(self.config)

    def prompt_arm(self, batch: int) -> Arm:
        """The arm of a round that reads a prompt (not counted, not priced): SPECULATE (its
        candidates read in the same forward) unless plain is chosen on measured rounds (carried
        over by `carry_alone`): candidates that a measured choice says do not pay are not added to it."""
        state = self._states.get(batch)
        if state is None or state.warming(self.config.warmup):
            return Arm.SPECULATE
        return state.choice

    def shadow_share(self, batch: int) -> float:
        """The share of a plain round's time shadow proposals may take now: `shadow_budget`, times
        `shadow_close / gap` (at least a quarter) where plain is chosen with speculation's estimate
        a share `gap` > `shadow_close` below it.  A shadow's worth is the chance it flips the
        choice; the further behind speculation is, the more tokens one shadow must show to flip it,
        and a shadow that shows them still comes within a few rounds."""
        budget = self.config.shadow_budget
        state = self._states.get(batch)
        if state is None or state.choice is Arm.SPECULATE or state.warming(self.config.warmup):
            return budget
        speculate, plain = (state.rates[arm].per_second for arm in (Arm.SPECULATE, Arm.PLAIN))
        gap = 1.0 - speculate / plain if plain > 0 else 0.0
        return budget * min(1.0, max(0.25, self.config.shadow_close / gap)) if gap > 0 else budget

    def play(self, batch: int) -> tuple[Arm, bool]:
        """The arm for a round of `batch` requests, and whether it is an exploration round."""
        state = self._state(batch)
        for arm in (state.choice, state.choice.other):  # warm-up: the prior's arm first
            if state.rates[arm].evidence < self.config.warmup:
                if arm is Arm.SPECULATE and state.shadows:
                    continue  # shadows are warming speculation up: no speculative round on a prior
                return arm, arm is not state.choice
        if state.choice is Arm.PLAIN and state.shadows:
            return Arm.PLAIN, False  # shadow rounds tell what speculation would do: no exploration needed
        if state.burst > 0 or state.since_explore + 1 >= state.interval:
            return state.choice.other, True
        return state.choice, False

    def chosen(self, batch: int) -> Arm:
        """The arm chosen at `batch` (a round that is not counted: no warm-up, no exploration)."""
        return self._state(batch).choice

    def proven(self, batch: int) -> bool:
        """Whether speculation is chosen at `batch` on measured rounds: both arms past their
        warm-up there (shadow rounds count for speculation) and SPECULATE the better.  A prior (a
        request alone starts on SPECULATE, a batch size carried from a neighbour starts on its
        choice) is not a measurement: rows added to a forward on a prior are unpriced."""
        state = self._states.get(batch)
        return state is not None and not state.warming(self.config.warmup) and state.choice is Arm.SPECULATE

    def shadow(self, batch: int, committed: Sequence[int], seconds: float | None = None) -> bool:
        """Shadow rounds (`draftwise.runtime.shadow`): speculative rounds of single requests at this point
        would have committed `committed` tokens each.  Counted as a SPECULATE round of the batch
        (each request committing their mean, `len(committed) / batch` rounds' worth of
        evidence), taking `seconds` (its price from the verify profile, which the caller knows), else
        that arm's mean measured round.  So speculation's estimate follows the text while plain
        rounds are played, and the choice returns to it at the next comparison once it pays.
        Ignored (False) without a price: no `seconds` and no measured SPECULATE round at `batch`.
        Priced shadows count toward speculation's warm-up: a batch that starts on plain rounds
        plays no speculative round until its shadows show speculation to pay."""
        state = self._state(batch)
        rate = state.rates[Arm.SPECULATE]
        if (rate.rounds == 0 and seconds is None) or not committed:
            return False
        weight = len(committed) / batch
        price = rate.mean_seconds if seconds is None else seconds
        rate.add(batch * sum(committed) / len(committed), price, self.config, state.clock, weight=weight)
        state.shadows += 1
        return True

    def mean_seconds(self, batch: int, arm: Arm) -> float:
        """The weighted mean seconds of `arm`'s rounds at `batch` (0.0 before any)."""
        state = self._states.get(batch)
        return 0.0 if state is None else state.rates[arm].mean_seconds

    def observe(self, batch: int, arm: Arm, tokens: int, seconds: float, explored: bool) -> None:
        state = self._state(batch)
        state.clock += 1
        warming = state.warming(self.config.warmup)
        self.ledger.append(ArmRound(batch, arm, tokens, seconds, explored))
        previous, state.last = state.last, arm
        if arm is Arm.PLAIN and previous is Arm.SPECULATE:
            seconds = self._charge_switch(state, seconds)
        state.rates[arm].add(tokens, seconds, self.config, state.clock)
        if warming:  # a warm-up round: compare once the last one is in, start no exploration
            state.since_explore = 0 if explored else state.since_explore + 1
            if state.warming(self.config.warmup):
                return
        elif explored and arm is not state.choice:
            # an exploration: `explore_rounds` rounds of the other arm, judged when it ends
            state.burst = (self.config.explore_rounds if state.burst == 0 else state.burst) - 1
            state.since_explore, state.turnover = 0, 0.0
            if state.burst > 0:
                return
        else:
            state.since_explore += 1
        best = self._better(batch, state)
        if best is not state.choice:
            state.choice, state.interval, state.since_explore = best, self.config.explore_every, 0
        elif explored:
            state.interval = min(2 * state.interval, self.config.max_interval)

    @staticmethod
    def _charge_switch(state: _BatchState, seconds: float) -> float:
        """A plain round right after a speculative one: what it took beyond plain's mean round was
        left to it by the speculative round (llama.cpp rebuilds its graph for the one-row shape:
        `benchmarks/heterogeneous/after_verify.py`), so that excess is added to
        speculation's seconds and the plain round counts without it.  Otherwise a plain
        exploration, which always follows a speculative round, would make plain look slower
        than it is."""
        plain, speculate = state.rates[Arm.PLAIN], state.rates[Arm.SPECULATE]
        if plain.weight <= 0 or speculate.weight <= 0:
            return seconds
        excess = max(0.0, seconds - plain.mean_seconds)
        speculate.seconds += excess
        return seconds - excess

    def _better(self, batch: int, state: _BatchState) -> Arm:
        """The arm whose rounds commit more tokens per second; in a batch, speculation must win by
        `batch_margin` (a tie goes to plain)."""
        margin = 1.0 + (self.config.batch_margin if batch > 1 else 0.0)
        speculate, plain = (state.rates[arm].per_second for arm in (Arm.SPECULATE, Arm.PLAIN))
        return Arm.SPECULATE if speculate > plain * margin else Arm.PLAIN

    def joined(self, batch: int) -> None:
        """A request joined a batch of `batch`: 1/batch of what the arms measured belonged to other
        requests.  Once the whole batch has turned over since the other arm was last played (at
        batch 1, every join: another prompt), it is explored at the next round and the
        exploration interval starts over.  (Restarting at every join cost a closed loop one
        exploration round per join, a loss wherever speculation loses: benchmarks/batch_throughput/.)
        Only speculation's value depends on which requests are in the batch (what their texts let
        the proposers guess); a plain step's price does not.  So a turnover re-checks speculation
        while plain is chosen without shadows, and nothing while speculation is chosen: its own
        rounds measure the new requests, and the regular explorations keep checking plain.  (Where
        speculation paid well, turnovers that forced plain rounds gave up part of its gain:
        benchmarks/batch_throughput/.)"""
        state = self._states.get(batch)
        if state is None or state.warming(self.config.warmup) or state.choice is Arm.SPECULATE:
            return
        state.turnover += 1.0 / batch
        if state.turnover < 1.0 - 1e-9:
            return
        state.turnover = 0.0
        state.interval = self.config.explore_every
        state.since_explore = max(state.since_explore, state.interval - 1)

    def estimates(self, batch: int) -> dict[Arm, float]:
        """Committed tokens per second of each arm at `batch` (0.0 where not yet played)."""
        state = self._states.get(batch)
        return {} if state is None else {arm: rate.per_second for arm, rate in state.rates.items()}

    def _state(self, batch: int) -> _BatchState:
        if batch < 1:
            raise InputError(f"a batch has at least one request, got {batch}")
        state = self._states.get(batch)
        if state is None:
            warm = [b for b, s in self._states.items() if not s.warming(self.config.warmup)]
            nearest = min(warm or self._states, key=lambda b: (abs(b - batch), b), default=None)
            # with nothing measured, a request alone speculates first (its rounds are its own), a
            # batch decodes plainly first: a speculative round's accepted tokens put its requests
            # out of step, and requests out of step read their successors' prompts in forwards of
            # their own (benchmarks/batch_throughput/, "B = 1, 2, 4, 8, and a batch that starts on
            # plain rounds")
            fresh = Arm.SPECULATE if batch == 1 else Arm.PLAIN
            prior = fresh if nearest is None else self._states[nearest].choice
            state = _BatchState({arm: _Rate() for arm in Arm}, prior, self.config.explore_every)
            if warm and nearest is not None:  # carried over, then checked by an exploration at once
                state = self._states[nearest].carried(self.config)
                state.since_explore = state.interval - 1
            self._states[batch] = state
        return state
