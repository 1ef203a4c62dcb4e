"""Do no harm across a batch: speculate only while it measurably commits more tokens per second.

The batch-aware gate (`draftwise.batch`) sizes each round by a profile t_B(n) taken on equal
prefixes.  The live batch is not that regime: its slots have different lengths (a padded cache
is as long as its longest slot), requests join and leave, and prompt lookup's value changes
within one answer.  So the price the profile gives can be wrong in either direction, and being
wrong toward "rows are cheap" makes speculation slower than plain batched decoding — the
complaint of every serving engine's tracker.  This controller decides, per batch size, between
two arms from what the rounds themselves measured:

- `SPECULATE`: each request's round as its gate (and the batch's depth cut) chose it;
- `PLAIN`: every round cut to depth 0 (one row per request: plain batched decoding).

Estimate.  For each (batch size, arm): exponentially weighted sums of the tokens the round
committed (across the batch) and of the round's wall time (propose, verify, select, commit);
their ratio is the arm's committed tokens per second.  An arm's weights decay by `decay` per
round of its own (a memory of ~30 rounds: speculation's rounds are bursty) and by `stale` per
round of the other arm (what it did 100 rounds ago counts a third).  Rounds that read a prompt
are not steady-state rounds and are not counted.

Policy.  An unseen batch size starts from the nearest batch size whose arms were both measured:
its choice, and both arms' estimates carried over as `warmup` rounds' worth of evidence (a
batch that shrinks as its last requests finish visits every size below it, and warming each one
up from nothing played the losing arm twice per size); the next round explores the other arm.
With no such neighbour a request alone starts on SPECULATE and a batch on PLAIN (a speculative
round puts a batch's requests out of step: side costs, below), and each arm is played `warmup`
rounds before any comparison, except that shadow rounds (below) stand in for speculation's: a
batch whose requests' proposers shadow plays no speculative round until the shadows show
speculation to pay.  Then the
arm with the higher estimate is played (in a batch, speculation must beat plain by
`batch_margin`, 3%: its side costs, below, are not in its rounds), and the other once every `interval` rounds, where
`interval` starts at `explore_every` and doubles (up to `max_interval`) each time an
exploration confirms the choice; it falls back to `explore_every` when the choice flips.

Loss bound.  Once both estimates are within a factor (1 + e) of the truth, the controller plays
the worse arm only in exploration rounds and in rounds where the two rates are within that
factor of each other, so its throughput is at least
    r_best * (1 - (1 - r_worse / r_best) / interval) / (1 + e)
with interval >= explore_every (8 by default, doubling to 128 while explorations confirm the
choice): at most 1/8 of the gap to the worse arm, i.e. 3% when speculation runs at 0.75x plain,
falling to 0.2% once the interval has grown.  Before that, the warm-up costs at most `warmup`
rounds of the worse arm at the first batch size measured, and one exploration round at each
batch size that starts from a measured neighbour.  What the bound does not cover is an estimate further
than (1 + e) from the truth: prompt lookup's value arrives in rare long matches, so a run of
misses can make speculation look worse than it is for a while.  Replayed on real greedy answers
(`benchmarks/do_no_harm/`), the controller came within 0.93-1.00x of the better fixed arm where
rows are cheap and beat both (1.05x) where they are not.  What it measures is what the run's
rounds took: on a noisy machine a slow spell moves both arms' estimates.

Side costs.  A batch's rounds do not see all that speculation costs it.  Plain rounds keep
requests of equal length in step: they end in the same round and the next ones read their
prompts together, in one forward, into a cache that just emptied.  Speculating requests commit
at different rates, so each joiner reads its prompt in a forward of its own beside the others'
rows, and the cache stays spread over more cells (llama.cpp's unified cache makes every row
attend over them).  Measured on llama.cpp at B = 8 (`benchmarks/batch_throughput/`): rounds
where speculation measured 2% faster than plain, and a run 9% slower end to end.  Those prompt
forwards are not decoding steps and are not priced, so the margin stands for them.

What a speculative round leaves to the next one is its cost too: on llama.cpp the first one-row
step after a many-row verify rebuilds the compute graph (1.5-1.9 ms on a 10 ms step, and ~0.7 ms
on each of the next few), so a plain exploration, which always follows a speculative round,
measured plain slower than it is.  The first plain round after a speculative one counts at most
plain's mean round; its excess is added to speculation's seconds (`_charge_switch`).

Shadow rounds (a request decoded alone, `draftwise.shadow`).  Where every proposer proposes from
the context alone and the verifier accepts exactly the rows the target publishes, a plain round
may carry a shadow proposal: once the next tokens are published, what a speculative round there
would have committed is known, and `shadow` counts it as a speculative round (priced by its own
rows on the gate's measured t(n) for a request alone, else at that arm's mean measured round).  Speculation's estimate then follows the text while plain steps are played,
the choice returns to speculating at the first comparison that favours it, and no exploration
of speculation is played while plain is chosen (they cost real rounds where speculation loses,
and came too rarely to catch a bursty source's good stretches).  What shadows cost is their
proposal alone, kept within `shadow_budget` of a plain round's time while the arms are within
`shadow_close` of each other, and within a smaller share (down to a quarter) the further
speculation is behind (`shadow_share`); in the bound above the
exploration term then applies to plain explorations only, and the estimate error e of the
speculative arm shrinks to the error of pricing a round at the arm's mean.

Across requests (a request alone).  A decoder's next request starts its guard where the last one
left off (`DoNoHarm.after`): its choice and both arms' estimates as `warmup` rounds' worth of
evidence.  So where speculation has not been paying, a new request plays no warm-up rounds of it
and reads its prompt without candidates (`prompt_arm`), costs that came back with every request
(at temperature 1 on the embedded model: ~90 ms a request, 2% of a 128-token answer); the new
text's own rounds and shadows outweigh the carried estimates within a few rounds.
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
    # weight of an arm's past per round of its own (its estimate spans ~1/(1 - decay) of its rounds):
    # long, because prompt lookup's rounds commit 1 or 11 tokens and a short memory reads a streak
    # of misses as a losing arm (benchmarks/do_no_harm/: 0.87x the better arm at 0.8, 0.95x at 0.97)
    decay: float = 0.97
    # weight of an arm's past per round of the OTHER arm: how fast what it did becomes stale
    stale: float = 0.99
    explore_rounds: int = 1  # consecutive rounds of the other arm per exploration
    # share of a plain round's time its shadow proposal may take (`draftwise.shadow`): prompt
    # lookup's ~0.1 ms shadows every round, the heads' ~1.5 ms every third on a 35 ms step
    shadow_budget: float = 0.02
    # in a batch (B > 1), SPECULATE is chosen only where its rounds measured this much faster than
    # plain rounds: speculation has costs its own rounds do not see.  Requests that commit at
    # different rates stop joining together, and a prompt read in a forward of its own (with the
    # others' rows) costs more per row than prompts read together (benchmarks/batch_throughput/:
    # on llama.cpp at B = 8, a speculating batch whose rounds measured 2% faster than plain ones
    # was 9% slower end to end)
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

    @classmethod
    def after(cls, previous: "DoNoHarm | None", config: DoNoHarmConfig) -> "DoNoHarm":
        """A controller for a decoder's next request alone, starting where `previous` (its last
        request's) left off: the choice it ended on and both arms' estimates, carried as `warmup`
        rounds' worth of evidence, so no warm-up rounds are played (and, where plain was chosen,
        the prompt is read without candidates, `prompt_arm`).  The new text's own rounds outweigh
        the carried ones within a few rounds; the next exploration comes after `explore_every`.
        Fresh (warm-up first) where `previous` had not measured both arms."""
        harm = cls(config)
        if previous is None:
            return harm
        state = previous._states.get(1)
        if state is not None and not state.warming(previous.config.warmup):
            harm._states[1] = state.carried(config)
        return harm

    def carry_alone(self) -> None:
        """A request starts alone on an engine that held none: its text is new.  As `after`: the
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
        over by `after`): candidates that a measured choice says do not pay are not added to it."""
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
        """Shadow rounds (`draftwise.shadow`): speculative rounds of single requests at this point
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
        left to it by the speculative round (llama.cpp rebuilds its graph for the one-row shape,
        `benchmarks/heterogeneous/`: 1.5-1.9 ms on a 10 ms step), so that excess is added to
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
        exploration interval starts over.  (Restarting at every join cost a closed loop at batch 8
        one exploration round per join: 5% of its throughput where speculation runs at 0.6x.)
        Only speculation's value depends on which requests are in the batch (what their texts let
        the proposers guess); a plain step's price does not.  So a turnover re-checks speculation
        while plain is chosen without shadows, and nothing while speculation is chosen: its own
        rounds measure the new requests, and the regular explorations keep checking plain.  (On
        the Qwen pair at B = 2, speculating at 2.3x plain, turnovers made 7 of 77 rounds plain.)"""
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
            # their own (benchmarks/batch_throughput/: llama.cpp at B = 4, 11 warm-up and explored
            # speculative rounds made 12 prompt forwards of the 4 plain decoding needs, 0.92x)
            fresh = Arm.SPECULATE if batch == 1 else Arm.PLAIN
            prior = fresh if nearest is None else self._states[nearest].choice
            state = _BatchState({arm: _Rate() for arm in Arm}, prior, self.config.explore_every)
            if warm and nearest is not None:  # carried over, then checked by an exploration at once
                state = self._states[nearest].carried(self.config)
                state.since_explore = state.interval - 1
            self._states[batch] = state
        return state
