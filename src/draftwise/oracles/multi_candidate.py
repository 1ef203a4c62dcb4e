"""Exhaustive oracles for multi-candidate verification.

The machinery enumerates every random choice of a round exactly instead of sampling it:
`enumerate_outcomes` runs a function that draws only through a `pick(weights)` callback,
replaying it once per leaf of its choice tree (depth-first, forcing a prefix of choices and
taking the first positive-weight option after it), and sums leaf probabilities per outcome.
Candidate draws, accept/reject branches and residual samples are all picks, so the result is
the exact law of the output, up to float64 rounding.

`node_marginal` does this for one node rule (p, q, draws) -> NodeDecision; `round_marginal`
does it end to end: draft a tree template from q_of, compile it, run a verifier's
`select_with`, and complete the stream with target samples so that the law of the first n
emitted tokens can be compared with the target's.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Hashable, Mapping, Protocol, Sequence

import numpy as np

from draftwise.runtime.contracts import (
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)
from draftwise.oracles.registry import OracleResult, register
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import CompiledRound, TreeLimits, compile_round
from draftwise.topology.templates import Template, max_depth, slots_by_parent
from draftwise.runtime.logits import NumpyLogits, TargetLogits
from draftwise.verify.base import Selection
from draftwise.verify.rejection import accept_probability, residual
from draftwise.verify.sequoia import SequoiaVerifier, without_replacement_q
from draftwise.verify.specinfer import NodeDecision, Pick, SpecInferVerifier, specinfer_node
from draftwise.verify.spectr import SpecTrVerifier, spectr_node

EXACT_TOL = 1e-12
NodeRule = Callable[[np.ndarray, np.ndarray, Sequence[int]], NodeDecision]
DistFn = Callable[[tuple[int, ...]], np.ndarray]  # prefix of emitted tokens -> distribution [V]
TEMPERATURE_ONE = SamplingPolicy(temperature=1.0)  # logits = log p, so the policy returns p


class PickVerifier(Protocol):
    def select_with(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, pick: Pick
    ) -> Selection: ...


# ---------------------------------------------------------------- enumeration machinery


class _Replay:
    """A pick that follows `forced` choices, then the first positive-weight option, recording
    every choice point so the caller can branch on the alternatives."""

    def __init__(self, forced: tuple[int, ...]) -> None:
        self.forced = forced
        self.taken: list[int] = []
        self.options: list[np.ndarray] = []
        self.prob = 1.0

    def __call__(self, weights: np.ndarray) -> int:
        w = np.asarray(weights, dtype=np.float64)  # [n]
        total = w.sum()
        if not total > 0.0:
            raise ValueError(f"pick over weights with no positive mass: {w}")
        probs = w / total  # [n]
        d = len(self.taken)
        i = self.forced[d] if d < len(self.forced) else int(np.flatnonzero(probs > 0.0)[0])
        self.taken.append(i)
        self.options.append(probs)
        self.prob *= float(probs[i])
        return i


def enumerate_outcomes(run: Callable[[Pick], Hashable]) -> dict[Hashable, float]:
    """Exact law of run(pick)'s return value over every sequence of picks."""
    law: dict[Hashable, float] = {}
    stack: list[tuple[int, ...]] = [()]
    while stack:
        forced = stack.pop()
        replay = _Replay(forced)
        outcome = run(replay)
        law[outcome] = law.get(outcome, 0.0) + replay.prob
        for d in range(len(forced), len(replay.taken)):  # branch only on choices made freely
            for alt in np.flatnonzero(replay.options[d] > 0.0):
                if alt != replay.taken[d]:
                    stack.append(tuple(replay.taken[:d]) + (int(alt),))
    return law


def draw_candidates(q: np.ndarray, k: int, relation: SamplingRelation, pick: Pick) -> tuple[int, ...]:
    """k sibling drafts from q [V], i.i.d. or without replacement (Sequoia's fallback included)."""
    tokens: list[int] = []
    for _ in range(k):
        if relation is SamplingRelation.WITHOUT_REPLACEMENT:
            tokens.append(pick(without_replacement_q(q, tokens)))
        else:
            tokens.append(pick(q))
    return tuple(tokens)


def node_outcome_law(rule: NodeRule, p: np.ndarray, q: np.ndarray, k: int,
                     relation: SamplingRelation) -> dict[Hashable, float]:
    """Law of (emitted token, accepted?) at one node over candidate draws and rule outcomes."""
    def run(pick: Pick) -> tuple[int, bool]:
        tokens = draw_candidates(q, k, relation, pick)
        decision = rule(p, q, tokens)
        i = pick(decision.outcome_weights())
        return (tokens[i], True) if i < k else (pick(decision.residual), False)

    return enumerate_outcomes(run)


def node_marginal(rule: NodeRule, p: np.ndarray, q: np.ndarray, k: int,
                  relation: SamplingRelation = SamplingRelation.IID) -> np.ndarray:
    """Exact law [V] of the token a node rule emits."""
    out = np.zeros(len(p))  # [V]
    for (token, _), prob in node_outcome_law(rule, p, q, k, relation).items():
        out[token] += prob
    return out


def node_acceptance(rule: NodeRule, p: np.ndarray, q: np.ndarray, k: int,
                    relation: SamplingRelation = SamplingRelation.IID) -> float:
    """Exact probability that the node rule accepts one of its drafts."""
    return sum(prob for (_, accepted), prob in node_outcome_law(rule, p, q, k, relation).items() if accepted)


def propose(template: Template, q_of: DistFn, relation: SamplingRelation, pick: Pick,
            topology: TopologyKind = TopologyKind.TREE) -> ProposalResult:
    """Draft `template` from q_of, the way a draft-model tree proposer would."""
    slots = slots_by_parent(template)
    nodes: list[ProposalNode] = []
    paths: list[tuple[int, ...]] = []
    siblings: dict[int, list[int]] = {}
    distributions: dict[int, np.ndarray] = {}
    for slot in slots:
        prefix = () if slot.parent == -1 else paths[slot.parent]
        q = distributions.setdefault(slot.parent, np.asarray(q_of(prefix), dtype=np.float64))  # [V]
        drawn = siblings.setdefault(slot.parent, [])
        q_now = without_replacement_q(q, drawn) if relation is SamplingRelation.WITHOUT_REPLACEMENT else q
        token = pick(q_now)
        drawn.append(token)
        depth = len(prefix) + 1
        nodes.append(ProposalNode(token=token, parent=slot.parent, depth=depth, q=float(q_now[token]),
                                  source="oracle-draft"))
        paths.append(prefix + (token,))
    contract = ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, relation, topology)
    return ProposalResult(tuple(nodes), contract, "oracle-draft", "oracle", distributions)


def round_marginal(verifier: PickVerifier, template: Template, p_of: DistFn, q_of: DistFn,
                   relation: SamplingRelation, n_tokens: int = 2,
                   topology: TopologyKind = TopologyKind.TREE,
                   limits: TreeLimits | None = None) -> dict[tuple[int, ...], float]:
    """Exact law of the first `n_tokens` emitted tokens: one round of `verifier` over drafts of
    `template`, continued with plain target samples when the round emitted fewer tokens
    (that continuation is what the next, exact, round would produce).  `limits` (default:
    room for the whole template) lets the compiler cut the drafts, as a round near the end of
    the context does."""
    limits = limits or TreeLimits(max_nodes=len(template) + 1, max_depth=max_depth(template) + 1)
    compiled: dict[tuple[int, ...], tuple[CompiledRound, NumpyLogits]] = {}

    def run(pick: Pick) -> tuple[int, ...]:
        result = propose(template, q_of, relation, pick, topology)
        key = tuple(node.token for node in result.nodes)
        if key not in compiled:  # the replay revisits the same drafts many times
            round_ = compile_round(1, [result], limits)
            rows = [p_of(())] + [p_of(round_.path_tokens(r)) for r in range(round_.n)]
            with np.errstate(divide="ignore"):
                compiled[key] = (round_, NumpyLogits(np.log(np.stack(rows))))  # [1 + N, V]
        round_, target = compiled[key]
        sel = verifier.select_with(round_, target, TEMPERATURE_ONE, pick)
        emitted = [int(round_.token_ids[r]) for r in sel.accepted_rows] + [sel.bonus_token]
        while len(emitted) < n_tokens:
            emitted.append(pick(p_of(tuple(emitted))))
        return tuple(emitted[:n_tokens])

    return enumerate_outcomes(run)  # type: ignore[return-value]


def target_law(p_of: DistFn, vocab: int, n_tokens: int) -> dict[tuple[int, ...], float]:
    """Law of the first n_tokens of plain target sampling."""
    law: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(vocab), repeat=n_tokens):
        prob = 1.0
        for i, t in enumerate(seq):
            prob *= float(p_of(seq[:i])[t])
        law[seq] = prob
    return law


def max_deviation(got: Mapping[Hashable, float], want: Mapping[Hashable, float]) -> float:
    keys = set(got) | set(want)
    return max((abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in keys), default=0.0)


def constant(dist: Sequence[float]) -> DistFn:
    """The same distribution after every prefix."""
    vec = np.asarray(dist, dtype=np.float64)  # [V]
    return lambda prefix: vec


def set_template(k: int) -> Template:
    return tuple((i,) for i in range(k))


def naive_retest_node(p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
    """The known-wrong rule: test every draft against the ORIGINAL p, residual only at the end.
    Kept here (not in verify/) because it exists only to be refuted."""
    stay = 1.0
    accept = np.zeros(len(tokens))  # [k]
    for i, x in enumerate(tokens):
        a = accept_probability(float(p[x]), float(q[x]))
        accept[i] = stay * a
        stay *= 1.0 - a
    return NodeDecision(accept, residual(p, q))


def membership_lp_optimum(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """Best acceptance P(Y in {X_1..X_k}) over all couplings of Y ~ p with k i.i.d. drafts X ~ q:
    a transport LP from candidate vectors (ordered k-tuples, mass q^k) to tokens (mass p),
    cost 0 when the token is among the candidates, solved with HiGHS."""
    from scipy.optimize import linprog  # scipy is heavy; only the LP oracles need it

    vocab = len(p)
    tuples = list(itertools.product(range(vocab), repeat=k))
    n_c = len(tuples)
    gain = np.array([[1.0 if y in c else 0.0 for y in range(vocab)] for c in tuples]).ravel()  # [C * V]
    a_eq = np.zeros((n_c + vocab, n_c * vocab))
    for i in range(n_c):
        a_eq[i, i * vocab:(i + 1) * vocab] = 1.0  # supply of candidate vector i
    for y in range(vocab):
        a_eq[n_c + y, y::vocab] = 1.0  # demand of token y
    b_eq = np.concatenate([[math.prod(float(q[t]) for t in c) for c in tuples], p])
    res = linprog(-gain, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"membership LP failed: {res.message}")
    return float(-res.fun)


def _result(name: str, computed: float, expected: float, tolerance: float, detail: str) -> OracleResult:
    return OracleResult(name, computed, expected, tolerance, abs(computed - expected) <= tolerance, detail)


# ---------------------------------------------------------------- the oracles

PAPER_P = (0.5, 0.3, 0.2)
PAPER_Q = (0.4, 0.4, 0.2)
# (p, q, k): dense, q with zeros where p has mass, q one-hot, k up to the vocabulary size
MARGINAL_CASES: tuple[tuple[tuple[float, ...], tuple[float, ...], int], ...] = (
    (PAPER_P, PAPER_Q, 2),
    ((0.7, 0.3, 0.0), (0.5, 0.1, 0.4), 2),
    ((0.1, 0.6, 0.3), (0.0, 0.2, 0.8), 3),
    ((0.25, 0.25, 0.5), (0.0, 1.0, 0.0), 2),
    ((0.1, 0.2, 0.3, 0.4), (0.4, 0.3, 0.0, 0.3), 3),
    ((0.5, 0.5), (0.0, 1.0), 2),
)


@register
def specinfer_exhaustive() -> OracleResult:
    p, q = np.array(PAPER_P), np.array(PAPER_Q)
    got = round_marginal(SpecInferVerifier(), set_template(2), constant(p), constant(q), SamplingRelation.IID, 1)
    dev = max_deviation(got, target_law(constant(p), 3, 1))
    return _result("specinfer_k2_marginal", dev, 0.0, EXACT_TOL,
                   f"SpecInfer, p={PAPER_P}, q={PAPER_Q}, k=2 i.i.d.: max |P(out) - p| over all draws and branches")


@register
def naive_retest_is_not_exact() -> OracleResult:
    p, q = np.array(PAPER_P), np.array(PAPER_Q)
    out = node_marginal(naive_retest_node, p, q, 2)
    dev = float(np.abs(out - p).max())
    return OracleResult("naive_retest_not_exact", dev, 0.0, 1e-3, dev > 1e-3,
                        f"re-testing each draft against the original p emits {np.round(out, 6).tolist()} instead "
                        f"of p={PAPER_P}; passes when the deviation exceeds the tolerance")


@register
def merged_duplicates_not_exact() -> OracleResult:
    """Why the residual walk reads draws from `origin`: testing only distinct tokens is biased."""
    p, q = np.array((0.7, 0.3, 0.0)), np.array((0.5, 0.1, 0.4))

    def distinct_only(p_: np.ndarray, q_: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        unique = list(dict.fromkeys(tokens))
        inner = specinfer_node(p_, q_, unique)
        accept = np.array([inner.accept[unique.index(t)] if t not in tokens[:i] else 0.0
                           for i, t in enumerate(tokens)])
        return NodeDecision(accept, inner.residual)

    dev = float(np.abs(node_marginal(distinct_only, p, q, 2) - p).max())
    exact = float(np.abs(node_marginal(specinfer_node, p, q, 2) - p).max())
    return OracleResult("merged_duplicates_not_exact", dev, 0.0, 1e-3, dev > 1e-3 and exact <= EXACT_TOL,
                        f"SpecInfer over distinct draws only deviates by {dev:.6f} from p=(0.7, 0.3, 0); over every "
                        f"draw (duplicates kept) by {exact:.2e}")


def _duplicate_mass(k: int) -> OracleResult:
    p, q = np.array((0.5, 0.5)), np.array((0.0, 1.0))  # every draft is token 1
    got = round_marginal(SpecInferVerifier(), set_template(k), constant(p), constant(q), SamplingRelation.IID, 1)
    correct = got.get((1,), 0.0)
    naive = float(node_marginal(naive_retest_node, p, q, k)[1])
    naive_ok = abs(naive - (1.0 - 2.0 ** -k)) <= EXACT_TOL
    return OracleResult(f"duplicate_mass_k{k}", correct, 0.5, EXACT_TOL,
                        abs(correct - 0.5) <= EXACT_TOL and naive_ok,
                        f"q one-hot at 1, p = Bernoulli(1/2), k={k}: residual walk P(1)={correct:.12f}; naive "
                        f"re-test P(1)={naive:.12f} (1 - 2^-k = {1.0 - 2.0 ** -k:.12f})")


for _k in range(1, 5):
    register(lambda _k=_k: _duplicate_mass(_k))


@register
def membership_lp() -> OracleResult:
    opt = membership_lp_optimum(np.array(PAPER_P), np.array(PAPER_Q), 2)
    return _result("membership_lp_k2", opt, 1.0, 1e-9,
                   f"max P(target token in the 2 i.i.d. drafts) over couplings, p={PAPER_P}, q={PAPER_Q} (HiGHS)")


def _marginal_over_cases(verifier: PickVerifier, relation: SamplingRelation, topology: TopologyKind) -> float:
    worst = 0.0
    for p, q, k in MARGINAL_CASES:
        got = round_marginal(verifier, set_template(k), constant(p), constant(q), relation, 2, topology)
        worst = max(worst, max_deviation(got, target_law(constant(p), len(p), 2)))
    return worst


@register
def sequoia_marginals() -> OracleResult:
    dev = _marginal_over_cases(SequoiaVerifier(), SamplingRelation.WITHOUT_REPLACEMENT, TopologyKind.TREE)
    tree_p, tree_q = (0.2, 0.5, 0.3), (0.6, 0.0, 0.4)
    tree = round_marginal(SequoiaVerifier(), ((0,), (1,), (0, 0), (0, 1)), constant(tree_p), constant(tree_q),
                          SamplingRelation.WITHOUT_REPLACEMENT, 2)
    dev = max(dev, max_deviation(tree, target_law(constant(tree_p), 3, 2)))
    return _result("sequoia_marginals", dev, 0.0, EXACT_TOL,
                   f"Sequoia, {len(MARGINAL_CASES)} (p, q, k) sets incl. q with zeros and one-hot (uniform "
                   "fallback), plus a depth-2 tree: max deviation of the first two tokens' law")


@register
def spectr_marginals() -> OracleResult:
    dev = _marginal_over_cases(SpecTrVerifier(), SamplingRelation.IID, TopologyKind.SET)
    return _result("spectr_marginals", dev, 0.0, EXACT_TOL,
                   f"SpecTr K-SEQ, {len(MARGINAL_CASES)} (p, q, k) sets incl. q with zeros and one-hot: max "
                   "deviation of the first two tokens' law")


SPECTR_RATIO_SEEDS = tuple(range(12))


@register
def spectr_vs_lp() -> OracleResult:
    bound = 1.0 - math.exp(-1.0)
    worst = math.inf
    above_opt = 0.0  # K-SEQ can never beat the optimal coupling; a positive value is a bug
    for seed in SPECTR_RATIO_SEEDS:
        rng = np.random.default_rng(seed)
        vocab, k = int(rng.integers(2, 5)), int(rng.integers(2, 4))
        p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
        acc = node_acceptance(spectr_node, p, q, k)
        opt = membership_lp_optimum(p, q, k)
        worst = min(worst, acc / opt)
        above_opt = max(above_opt, acc - opt)
    return OracleResult("spectr_vs_lp", worst, bound, 1e-12, worst >= bound - 1e-12 and above_opt <= 1e-9,
                        f"min over {len(SPECTR_RATIO_SEEDS)} random instances (V<=4, k<=3) of K-SEQ acceptance / "
                        f"LP optimum; must be >= 1 - 1/e = {bound:.6f}; max acceptance - optimum = {above_opt:.2e}")
