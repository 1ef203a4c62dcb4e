"""Cost gate: how deep to verify this round, chosen by predicted time per committed token.

A round that verifies candidate depths 1..d costs t(1 + rows(d)) (the measured verify profile in
plain-step units; t_B(n) in a batch of B) and commits 1 + E[accepted | d] tokens; the gate
verifies the d in 0..max that maximizes their ratio, d = 0 being an ordinary target step.
E[accepted | d] comes from recency-weighted acceptance rates learned by walking the published
tokens down the full proposal, cut rows included (`SourceGate`: one model per source of a union,
and the union's recent walks).  The gate only removes rows, chosen from the drawn tokens, so it
serves only the verifiers exact for any candidates (greedy, membership) and refuses the others.
How it prices a round and learns: docs/trees-and-planning.md, "How the gate prices a round".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.topology.compile import CompiledRound, cut_to_depth, keep_rows
from draftwise.runtime.union_walks import UnionWalks, proposing
from draftwise.verify.base import IncompatibleVerifier, VerifierCapabilities, child_with_token


@dataclass(frozen=True)
class CostGateConfig:
    profile: VerifyCostProfile  # t(n) of this target, backend and thread count
    decay: float = 0.5  # weight a round's evidence keeps per later round (a short memory: acceptance drifts)
    prior_first: float = 0.5  # h1 the estimate returns to without evidence
    prior_continue: float = 0.8  # hc likewise
    prior_weight: float = 1.0  # pseudo-observations behind each prior
    # in a batch of B requests the gate prices rows by t_B(n) (a shared forward of n rows per
    # request against a plain batched step) instead of the batch-1 `profile`
    batch_profile: BatchCostProfile | None = None
    # a union's E[accepted] from the recent rounds' walks down the merged tree, blended with the
    # independent model (`SourceGate`); False: the independent model alone (what the replay in
    # benchmarks/heterogeneous/union_replay.py compares it with)
    union_walks: bool = True
    # weight a union's walk keeps per later round: far longer memory than the rates' (a walk is
    # one round's outcome for every depth vector at once, so few rounds make a noisy estimate;
    # chosen by replay, benchmarks/heterogeneous/union_replay.py)
    walk_decay: float = 0.95
    # a union asks a source that costs drafting time (the heads, a draft model) only in rounds
    # where the gate is predicted to verify some of its rows (`SourceGate.ask`); False: every
    # source every round (what the replay compares it with)
    ask_by_cost: bool = True

    def __post_init__(self) -> None:
        if not (0.0 <= self.decay < 1.0 and 0.0 <= self.walk_decay < 1.0):
            raise InputError(f"decay and walk_decay must be in [0, 1), got {self.decay} and {self.walk_decay}")
        if not (0.0 <= self.prior_first <= 1.0 and 0.0 <= self.prior_continue <= 1.0):
            raise InputError("prior acceptance rates must be in [0, 1]")
        if self.prior_weight <= 0.0:
            raise InputError(f"prior_weight must be > 0, got {self.prior_weight}")


class _DecayedRate:
    """successes / trials with old evidence decayed toward `prior` (a frozen pseudo-count)."""

    def __init__(self, prior: float, weight: float) -> None:
        self.successes, self.trials = prior * weight, weight
        self._prior_successes, self._prior_trials = prior * weight, weight

    def decay(self, factor: float) -> None:
        self.successes = self._prior_successes + (self.successes - self._prior_successes) * factor
        self.trials = self._prior_trials + (self.trials - self._prior_trials) * factor

    def add(self, success: bool) -> None:
        self.successes += float(success)
        self.trials += 1.0

    @property
    def rate(self) -> float:
        return self.successes / self.trials


class CostGate:
    """Per-generation state of the gate; `CostGateConfig` is the part that never changes."""

    def __init__(self, config: CostGateConfig) -> None:
        self.config = config
        self.first = _DecayedRate(config.prior_first, config.prior_weight)
        self.further = _DecayedRate(config.prior_continue, config.prior_weight)
        self._open_walk: tuple[CompiledRound, np.ndarray | None, int, int] | None = None  # (proposal, own rows, row, depth) still open
        self.batch = 1  # requests sharing this round's forward (the batch engine sets it each round)

    @property
    def profile(self) -> VerifyCostProfile:
        return round_profile(self.config, self.batch)

    def expected_accepted(self, depth: int) -> float:
        """E[accepted | a chain of `depth` candidates] under the current rates."""
        h1, hc = self.first.rate, self.further.rate
        reach, total = h1, 0.0
        for _ in range(depth):
            total += reach
            reach *= hc
        return total

    def choose(self, rows_within: Sequence[int]) -> int:
        """The depth to verify.  `rows_within[d]` = candidate rows of depth <= d (rows_within[0]
        = 0); depths whose row count the profile has not measured are never chosen."""
        profile = self.profile
        best_depth, best_rate = 0, 1.0 / profile.relative_at(1)
        for depth in range(1, len(rows_within)):
            n = 1 + rows_within[depth]
            if n > profile.max_rows:
                break
            rate = (1.0 + self.expected_accepted(depth)) / profile.relative_at(n)
            if rate > best_rate:  # ties go to the cheaper round
                best_depth, best_rate = depth, rate
        return best_depth

    def observe(self, offered: CompiledRound | None, published: Sequence[int], own: np.ndarray | None = None) -> None:
        """Learn from the round: walk `published` (accepted tokens, then the target's own) down
        the full proposal `offered`, cut rows included (`own` [N] bool: only these rows, one
        source's in a merged round).  A walk that runs out of published tokens with candidates
        still below (a round cut short, a plain step) continues into the next rounds' tokens,
        so a gate that keeps taking plain steps still learns how far the proposals would have
        gone, not only whether their first token was right."""
        self.first.decay(self.config.decay)
        self.further.decay(self.config.decay)
        if self._open_walk is not None:
            earlier, earlier_own, parent, depth = self._open_walk
            self._open_walk = self._walk(earlier, earlier_own, parent, depth, published)
        if offered is not None and offered.n:  # one walk stays open: the newest proposal's
            self._open_walk = self._walk(offered, own, -1, 0, published)

    def _walk(self, offered: CompiledRound, own: np.ndarray | None, parent: int, depth: int,
              published: Sequence[int]) -> tuple[CompiledRound, np.ndarray | None, int, int] | None:
        """Count each published token against the candidates under `parent` (at `depth`);
        return where the walk stands if the tokens ran out before the candidates did."""
        for token in published:
            children = _children(offered, own, parent)
            if not children:
                return None  # the proposal ends here: nothing to learn about deeper candidates
            depth += 1
            match = child_with_token(offered, parent, int(token))
            if match is not None and own is not None and not own[match]:
                match = None  # another source's row (a full-prefix merge leaves one child per token)
            (self.first if depth == 1 else self.further).add(match is not None)
            if match is None:
                return None
            parent = match
        return (offered, own, parent, depth) if _children(offered, own, parent) else None


def _children(offered: CompiledRound, own: np.ndarray | None, parent: int) -> list[int]:
    return [row for row in offered.children_of(parent) if own is None or own[row]]


def round_profile(config: CostGateConfig, batch: int) -> VerifyCostProfile:
    """t(n) for a round of `batch` requests: the batch-1 profile, or t_B(n) for that batch."""
    return config.profile if config.batch_profile is None else config.batch_profile.at(batch)


def make_gate(config: CostGateConfig | None, sources: int) -> "CostGate | SourceGate | None":
    """The gate of a generation whose rounds merge `sources` proposers' candidates."""
    if config is None:
        return None
    return SourceGate(config, sources) if sources > 1 else CostGate(config)


class SourceGate:
    """The cost gate of a heterogeneous round (`prompt-lookup+hydra++`): a depth per source, chosen
    together, from what the sources' rows committed together in recent rounds.

    One pooled model over the merged tree (what `CostGate` keeps) cannot tell a source that
    copies well from one that proposes well on prose: where prompt lookup's rows are wasted and
    the heads' are not, it can only cut both by depth, and the union fell behind the heads alone
    there (benchmarks/heterogeneous/).  Here each source s verifies
    depths 1..d_s; the round maximizes (1 + E[accepted | d]) / t(rows(d)) over the depth vector d,
    rows(d) the merged tree's rows that survive the cut (a row proposed by several sources
    counted once).  E[accepted | d] is what the recent rounds' walks down the full merged tree
    would have committed under d (`UnionWalks`: it sees the sources' overlap, a row the heads
    also proposed adds nothing of lookup's own), blended at `prior_weight` with an independent
    model: one acceptance model per source, learned by walking the published tokens down that
    source's own rows, the sources taken as alternatives for the first token, tried in order of
    their first-token rate: E = sum_j prod_{i before j} (1 - h1_i) E_j(d_j).  A source at depth 0
    is not verified at all this round (its rows are cut), and keeps learning from the walks.

    A source that costs drafting time (the heads, a draft model) is asked only in rounds where
    the gate would verify some of its rows (`ask`): where prompt lookup copies well the heads'
    rows add little that lookup's do not, and drafting them every round for a cut to depth 0
    cost the union throughput (benchmarks/heterogeneous/).  Sources are asked cheapest first.
    """

    MAX_COMBINATIONS = 1024  # depth vectors searched exhaustively; beyond, coordinate ascent
    # plain steps: a source that drafts for less is always asked.  Prompt lookup drafts for far less
    # on either backend, the heads for more: lookup's value is in its proposal of the moment (a
    # copy run starts), which asking it reveals for free
    FREE_DRAFTING = 0.05
    ASK_PATIENCE = 4  # rounds a skipped source waits before it is asked again to re-measure its worth...
    MAX_PATIENCE = 32  # ...doubled each time it is still not worth asking, up to this
    DRAFT_DECAY = 0.8  # weight a drafting-time measurement keeps per later one

    def __init__(self, config: CostGateConfig, sources: int) -> None:
        if sources < 2:
            raise InputError(f"a per-source gate serves two or more sources, got {sources}")
        self.config = config
        self.gates = [CostGate(config) for _ in range(sources)]
        self.walks = UnionWalks(sources, config.walk_decay)
        self.batch = 1
        self._depths: tuple[int, ...] = (0,) * sources  # the last round's choice
        self._present = (1 << sources) - 1  # bitmask of the sources that proposed in the last round
        self._own: tuple[CompiledRound, list[np.ndarray]] | None = None  # the last round's rows per source
        # asking by cost: per source, the decayed mean drafting seconds (None: never measured),
        # its last proposal's rows within each depth ([D + 1] cumulative), rounds skipped since
        # it was last asked and the rounds it waits before it is asked anyway
        self._draft_s: list[float | None] = [None] * sources
        self._shape: list[np.ndarray | None] = [None] * sources
        self._skipped = [0] * sources
        self._patience = [self.ASK_PATIENCE] * sources

    @property
    def profile(self) -> VerifyCostProfile:
        return round_profile(self.config, self.batch)

    def independent_union(self, depths: np.ndarray) -> np.ndarray:
        """[C] E[accepted] of each depth vector depths[c] [C, S] with the sources independent."""
        tables = [np.array([gate.expected_accepted(d) for d in range(int(depths[:, k].max()) + 1)])
                  for k, gate in enumerate(self.gates)]
        total = np.zeros(depths.shape[0], dtype=np.float64)
        missed = np.ones(depths.shape[0], dtype=np.float64)
        for k in sorted(range(len(self.gates)), key=lambda k: -self.gates[k].first.rate):
            total += missed * tables[k][depths[:, k]]
            missed *= np.where(depths[:, k] > 0, 1.0 - self.gates[k].first.rate, 1.0)
        return total

    def union_expectation(self, depths: np.ndarray, present: int | None = None) -> np.ndarray:
        """[C] E[accepted] of the merged round that verifies depths 1..depths[c, s] of each source s:
        the recorded walks of rounds where the sources `present` (default: the last round's)
        proposed, blended with the independent model at `prior_weight`."""
        if not self.config.union_walks:
            return self.independent_union(depths)
        walked, weight = self.walks.expected(depths, self._present if present is None else present)
        prior = self.config.prior_weight
        return (prior * self.independent_union(depths) + weight * walked) / (prior + weight)

    def expected_union(self, depths: Sequence[int], present: int | None = None) -> float:
        return float(self.union_expectation(np.asarray([depths], dtype=np.int64), present)[0])

    def expected_accepted(self, depth: int) -> float:
        """E[accepted] of the round chosen last, cut further to `depth` (a batch's deeper cut)."""
        return self.expected_union([min(d, depth) for d in self._depths])

    def start_round(self) -> list[int]:
        """The order to ask the sources in this round: cheapest measured drafting first, the
        unmeasured last, ties in the union's order."""
        return sorted(range(len(self.gates)), key=lambda k: (self._draft_s[k] is None, self._draft_s[k] or 0.0, k))

    def drafted(self, source: int, seconds: float) -> None:
        """`source` was asked this round and took `seconds` to propose."""
        previous = self._draft_s[source]
        self._draft_s[source] = seconds if previous is None else \
            self.DRAFT_DECAY * previous + (1.0 - self.DRAFT_DECAY) * seconds

    def draft_cost(self, source: int) -> float:
        """`source`'s drafting time in plain steps (0 where unmeasured or the profile has no seconds)."""
        seconds, profile = self._draft_s[source], self.profile
        return 0.0 if seconds is None or profile.absolute_s is None else seconds / profile.absolute_at(1)

    def ask(self, source: int, partial: Callable[[], CompiledRound]) -> bool:
        """Whether to ask `source` this round, given `partial()`: the round compiled from the
        sources asked before it (the others empty; compiled only where the answer needs it).  A
        source that drafts for free is always asked; one that costs drafting time is asked when
        the best round with its rows (their count taken from its last proposal) is predicted to
        commit more tokens per plain step than the best round without them, its drafting time
        left out of the comparison: priced in, against the round's own rate or against the
        answer's running rate (renewal reward), it skipped the heads where they paid over several
        rounds, and lost to asking them every round on the replayed trace sets, where this way
        won (benchmarks/heterogeneous/).  A skipped source is asked again after `patience`
        rounds, to re-measure its worth."""
        if not self.config.ask_by_cost or self.draft_cost(source) < self.FREE_DRAFTING or self._shape[source] is None:
            return True
        if self._skipped[source] >= self._patience[source]:  # explore, and wait longer next time
            self._skipped[source] = 0
            self._patience[source] = min(2 * self._patience[source], self.MAX_PATIENCE)
            return True
        if self._would_verify(source, partial()):
            self._skipped[source], self._patience[source] = 0, self.ASK_PATIENCE
            return True
        self._skipped[source] += 1
        return False

    def _would_verify(self, source: int, partial: CompiledRound) -> bool:
        own = [own_rows(partial, k) for k in range(len(self.gates))]
        own[source] = np.zeros(partial.n, dtype=bool)
        shape = self._shape[source]  # [D_k + 1] its rows within each depth, last proposal
        assert shape is not None
        deepest = [int(partial.depth[mask].max()) if mask.any() else 0 for mask in own]
        deepest[source] = len(shape) - 1
        if int(np.prod([top + 1 for top in deepest])) > self.MAX_COMBINATIONS:
            return True  # too many to weigh: ask, as without the rule
        depths = np.array(list(itertools.product(*(range(top + 1) for top in deepest))), dtype=np.int64)  # [C, S]
        present = proposing(own) | 1 << source
        committed = 1.0 + self.union_expectation(depths, present)  # [C]
        # its rows counted apart from the others' (a row both propose is priced twice: an upper bound)
        n = 1 + self._surviving(partial, own, depths) + shape[depths[:, source]]  # [C]
        rate = committed / self.profile.relative_many(n)  # [C]
        without = depths[:, source] == 0
        return bool(rate[~without].max() > rate[without].max())

    @staticmethod
    def _surviving(offered: CompiledRound, own: Sequence[np.ndarray], depths: np.ndarray) -> np.ndarray:
        """[C] rows of `offered` that survive each depth vector depths[c] [C, S] (a row survives
        when a source that proposed it verifies that deep)."""
        owners = np.stack(own, axis=1)  # [N, S]
        reach = np.where(owners[None, :, :], depths[:, None, :], -1).max(axis=2)  # [C, N]
        surviving: np.ndarray = (offered.depth[None, :] <= reach).sum(axis=1)
        return surviving

    def choose(self, offered: CompiledRound, own: Sequence[np.ndarray]) -> tuple[int, ...]:
        """A depth per source for `offered` (`own` [S] of [N] bool: each source's rows)."""
        profile = self.profile
        self._present = proposing(own)
        deepest = [int(offered.depth[mask].max()) if mask.any() else 0 for mask in own]
        for k, mask in enumerate(own):  # what asking it again would add (`ask`)
            if mask.any():
                self._shape[k] = np.cumsum(np.bincount(offered.depth[mask], minlength=deepest[k] + 1))

        def rates(depths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # depths [C, S] -> rate, rows [C]
            n = 1 + self._surviving(offered, own, depths)  # [C]
            cost = profile.relative_many(n)  # [C]
            return (1.0 + self.union_expectation(depths)) / cost, n

        combinations = int(np.prod([top + 1 for top in deepest]))
        if combinations <= self.MAX_COMBINATIONS:
            depths = np.array(list(itertools.product(*(range(top + 1) for top in deepest))), dtype=np.int64)
            value, n = rates(depths)
            order = np.lexsort((np.arange(len(n)), n))  # ties go to the cheaper round (visited first)
            return tuple(int(d) for d in depths[order[int(np.argmax(value[order]))]])
        best = np.zeros((1, len(own)), dtype=np.int64)
        best_rate = rates(best)[0][0]
        for _ in range(2):  # coordinate ascent: each source's depth with the others held
            for k, top in enumerate(deepest):
                trials = np.repeat(best, top + 1, axis=0)
                trials[:, k] = np.arange(top + 1)
                value, _ = rates(trials)
                if value.max() > best_rate:
                    best, best_rate = trials[int(np.argmax(value))][None, :], float(value.max())
        return tuple(int(d) for d in best[0])

    def cut(self, offered: CompiledRound) -> tuple[CompiledRound, bool]:
        """`offered` with each source's rows deeper than its chosen depth cut (a row stays while
        any source that proposed it keeps it), and whether anything was cut."""
        own = self._rows_of(offered)
        self._depths = self.choose(offered, own)
        keep = np.zeros(offered.n, dtype=bool)
        for mask, depth in zip(own, self._depths):
            keep |= mask & (offered.depth <= depth)
        if keep.all():
            return offered, False
        return keep_rows(offered, keep), True

    def observe(self, offered: CompiledRound | None, published: Sequence[int]) -> None:
        """Each source's model walks the published tokens down its own rows of `offered`, and the
        union's walk down all of them is recorded."""
        own = None if offered is None else self._rows_of(offered)
        for k, gate in enumerate(self.gates):
            rows = None if own is None else own[k]
            gate.observe(offered if rows is None or rows.any() else None, published, rows)
        self.walks.observe(offered, own, published)

    def _rows_of(self, offered: CompiledRound) -> list[np.ndarray]:
        """[S] of [N] bool: each source's rows of `offered` (kept from `cut` for `observe`)."""
        if self._own is None or self._own[0] is not offered:
            self._own = (offered, [own_rows(offered, k) for k in range(len(self.gates))])
        return self._own[1]


def own_rows(round_: CompiledRound, source: int) -> np.ndarray:
    """[N] bool: the rows source `source` proposed (merged rows included), from `origin`."""
    mask = np.zeros(round_.n, dtype=bool)
    rows = [r for r in (round_.origin[source] if source < len(round_.origin) else ()) if r >= 0]
    mask[rows] = True
    return mask


def check_gateable(verifier: VerifierCapabilities) -> None:
    """Refuse a gate in front of a verifier whose exactness needs every draw tested."""
    if not verifier.any_candidates:
        raise IncompatibleVerifier(
            f"the cost gate picks how deep to verify from the proposal's rows, which depend on the drawn "
            f"tokens; verifier {verifier.name!r} is exact only when every draw is tested whatever its value, "
            "so a gated round would bias its output: gate a greedy or membership verifier, or drop the gate"
        )


def rows_within_depths(round_: CompiledRound, max_depth: int) -> list[int]:
    """[max_depth + 1]: candidate rows of depth <= d, for d = 0..max_depth."""
    counts = np.bincount(round_.depth, minlength=max_depth + 1)[: max_depth + 1]  # [max_depth + 1]
    return [int(n) for n in np.cumsum(counts)]


def gate_round(gate: CostGate | SourceGate | None, offered: CompiledRound, *,
               reads_prompt: bool) -> tuple[CompiledRound, bool]:
    """The round to verify and whether the gate cut it: `offered` without its rows deeper than
    `gate` chooses, so exactly the rows the gate priced.  The replay runs the engine itself (on
    a trace backend), so replayed predictions gate exactly as decoding does.  A round that reads the
    prompt (round 1) is never cut: its forward reads the whole prompt anyway, so its candidate
    rows are nearly free."""
    if gate is None or reads_prompt or not offered.n:
        return offered, False
    if isinstance(gate, SourceGate):
        return gate.cut(offered)
    deepest = int(offered.depth.max())
    depth = gate.choose(rows_within_depths(offered, deepest))
    if depth >= deepest:
        return offered, False
    return cut_to_depth(offered, depth), True
