"""Exactness by exhaustive enumeration on random small instances, and planted bugs caught by the
same enumeration.

For random vocabularies (V <= 4), random target/draft conditionals (dense, sparse, one-hot)
and random small tree shapes, the enumerated law of the first two emitted tokens of every
exact multi-candidate verifier must equal the target's.  Each planted-bug variant below is a
test-local subclass; it must be caught on at least one of a few fixed instances.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftwise.runtime.contracts import SamplingRelation, TopologyKind
from draftwise.oracles.multi_candidate import (
    constant,
    max_deviation,
    node_marginal,
    round_marginal,
    set_template,
    target_law,
)
from draftwise.topology.compile import CompiledRound
from draftwise.topology.templates import Template, from_paths
from draftwise.verify.rejection import accept_probability, residual
from draftwise.verify.sequoia import SequoiaVerifier, sequoia_node
from draftwise.verify.specinfer import NodeDecision, SpecInferVerifier, specinfer_node
from draftwise.verify.spectr import SpecTrVerifier, spectr_node

TOL = 1e-10  # float64 sums over a few thousand leaves
IID = SamplingRelation.IID
WOR = SamplingRelation.WITHOUT_REPLACEMENT
PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MAX_LEAVES = 300  # bound on V ** (number of drafts) so one example enumerates in well under a second


def random_dist(rng: np.random.Generator, vocab: int, style: int) -> np.ndarray:
    """style 0: dense; 1: some zeros; 2: one-hot."""
    if style == 2:
        return np.eye(vocab)[rng.integers(vocab)]
    d = rng.dirichlet(np.ones(vocab))
    if style == 1:
        d[rng.random(vocab) < 0.4] = 0.0
        if d.sum() == 0.0:
            d[rng.integers(vocab)] = 1.0
        d /= d.sum()
    return d


class Conditionals:
    """A deterministic random conditional model: prefix -> distribution [V]."""

    def __init__(self, seed: int, vocab: int, style: int) -> None:
        self.seed, self.vocab, self.style = seed, vocab, style
        self.cache: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in self.cache:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            style = self.style if self.style < 3 else int(rng.integers(3))  # 3: mixed per prefix
            self.cache[prefix] = random_dist(rng, self.vocab, style)
        return self.cache[prefix]


@st.composite
def instances(draw, relation: SamplingRelation, depth2: bool = True):
    vocab = draw(st.integers(2, 4))
    cap = vocab if relation is WOR else 3  # without replacement: at most V siblings
    root = draw(st.integers(1, min(cap, 3)))
    paths: list[tuple[int, ...]] = [(i,) for i in range(root)]
    if depth2:
        for i in range(root):
            paths += [(i, j) for j in range(draw(st.integers(0, min(cap, 2))))]
    if vocab ** len(paths) > MAX_LEAVES:
        paths = paths[: max(root, int(np.log(MAX_LEAVES) / np.log(vocab)))]
    template = from_paths(paths)
    p_of = Conditionals(draw(st.integers(0, 2**31)), vocab, draw(st.integers(0, 3)))
    q_of = Conditionals(draw(st.integers(0, 2**31)), vocab, draw(st.integers(0, 3)))
    return template, p_of, q_of, vocab


def deviation(verifier, template: Template, p_of, q_of, vocab: int, relation: SamplingRelation,
              topology: TopologyKind = TopologyKind.TREE) -> float:
    got = round_marginal(verifier, template, p_of, q_of, relation, 2, topology)
    assert abs(sum(got.values()) - 1.0) < TOL
    return max_deviation(got, target_law(p_of, vocab, 2))


# ------------------------------------------------------------------ exactness


@PROPERTY
@given(instances(IID))
def test_specinfer_tree_is_exact(case):
    template, p_of, q_of, vocab = case
    assert deviation(SpecInferVerifier(), template, p_of, q_of, vocab, IID) < TOL


@PROPERTY
@given(instances(WOR))
def test_sequoia_tree_is_exact(case):
    template, p_of, q_of, vocab = case
    assert deviation(SequoiaVerifier(), template, p_of, q_of, vocab, WOR) < TOL


@PROPERTY
@given(instances(WOR, depth2=False))
def test_sequoia_set_is_exact(case):
    """A one-position set drawn without replacement, verified by Sequoia (the automatic choice)."""
    template, p_of, q_of, vocab = case
    assert deviation(SequoiaVerifier(), template, p_of, q_of, vocab, WOR, TopologyKind.SET) < TOL


@PROPERTY
@given(instances(IID, depth2=False))
def test_spectr_set_is_exact(case):
    template, p_of, q_of, vocab = case
    assert deviation(SpecTrVerifier(), template, p_of, q_of, vocab, IID, TopologyKind.SET) < TOL


@PROPERTY
@given(st.integers(2, 4), st.integers(1, 3), st.integers(0, 2**31), st.integers(0, 2), st.integers(0, 2))
def test_node_rules_emit_p(vocab, k, seed, p_style, q_style):
    rng = np.random.default_rng(seed)
    p, q = random_dist(rng, vocab, p_style), random_dist(rng, vocab, q_style)
    for rule, relation in ((specinfer_node, IID), (spectr_node, IID), (sequoia_node, WOR)):
        if relation is WOR and k > vocab:
            continue
        np.testing.assert_allclose(node_marginal(rule, p, q, k, relation), p, atol=TOL)


# ------------------------------------------------------------------ planted bugs


class ResidualSkipped(SpecInferVerifier):
    """Every draft is tested against the original p; the residual is formed only at the end."""

    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        stay, accept = 1.0, np.zeros(len(tokens))
        for i, x in enumerate(tokens):
            a = accept_probability(float(p[x]), float(q[x]))
            accept[i], stay = stay * a, stay * (1.0 - a)
        return NodeDecision(accept, residual(p, q))


class DuplicatesMerged(SpecInferVerifier):
    """Tests the distinct child rows instead of every draw."""

    def draws(self, round_: CompiledRound, row: int) -> tuple[int, ...]:
        return round_.children_of(row)


class SiblingOrderIgnoredSpecInfer(SpecInferVerifier):
    """Tests the drafts in token order instead of draw order."""

    def draws(self, round_: CompiledRound, row: int) -> tuple[int, ...]:
        return tuple(sorted(super().draws(round_, row), key=lambda r: int(round_.token_ids[r])))


class SiblingOrderIgnoredSequoia(SequoiaVerifier):
    def draws(self, round_: CompiledRound, row: int) -> tuple[int, ...]:
        return tuple(sorted(super().draws(round_, row), key=lambda r: int(round_.token_ids[r])))


class QNotRenormalized(SequoiaVerifier):
    """Removes sampled siblings from q but forgets to renormalize (and so has no fallback)."""

    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        r, stay, accept = p, 1.0, np.zeros(len(tokens))
        q_i = np.array(q, dtype=np.float64)
        for i, x in enumerate(tokens):
            a = min(1.0, float(r[x]) / float(q_i[x])) if q_i[x] > 0 else 1.0
            accept[i], stay = stay * a, stay * (1.0 - a)
            r = residual(r, q_i)
            q_i[x] = 0.0
        return NodeDecision(accept, r)


class SpecTrResidualSkipped(SpecTrVerifier):
    """After k rejections emits a sample of p itself instead of K-SEQ's residual."""

    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        d = spectr_node(p, q, tokens)
        return NodeDecision(d.accept, p)


SET = TopologyKind.SET
TREE = TopologyKind.TREE
PLANTED = [  # (buggy, correct, relation, topology, template)
    (ResidualSkipped(), SpecInferVerifier(), IID, TREE, set_template(3)),
    (DuplicatesMerged(), SpecInferVerifier(), IID, TREE, set_template(3)),
    (SiblingOrderIgnoredSpecInfer(), SpecInferVerifier(), IID, TREE, set_template(3)),
    (SiblingOrderIgnoredSequoia(), SequoiaVerifier(), WOR, TREE, set_template(2)),
    (QNotRenormalized(), SequoiaVerifier(), WOR, TREE, set_template(2)),
    (QNotRenormalized(), SequoiaVerifier(), WOR, SET, set_template(2)),  # the same bug on a one-position set
    (SpecTrResidualSkipped(), SpecTrVerifier(), IID, SET, set_template(2)),
]


def test_planted_bugs_are_caught_and_the_correct_verifiers_are_not():
    """Each buggy variant must deviate by > 1e-3 on one of a few fixed instances on which the
    correct verifier is exact: the enumeration sees the bug, not noise."""
    for buggy, correct, relation, topology, template in PLANTED:
        worst = 0.0
        for seed in range(6):
            rng = np.random.default_rng(seed)
            p, q = constant(random_dist(rng, 3, 0)), constant(random_dist(rng, 3, 0))
            assert deviation(correct, template, p, q, 3, relation, topology) < TOL
            worst = max(worst, deviation(buggy, template, p, q, 3, relation, topology))
        assert worst > 1e-3, f"{type(buggy).__name__} was not caught (max deviation {worst:.2e})"


# ------------------------------------------------------------------ row budget


def test_residual_verifiers_stay_exact_when_the_row_budget_cuts_the_drafts():
    """A round near the end of the context has room for fewer nodes than the template.  The
    compiler cuts the drafts by position alone.  Counting rows instead (compiler version 1)
    kept a later i.i.d. draw only when it repeated an earlier one, so the draws tested were
    chosen by their values (SpecInfer, p uniform, q = (.6, .3, .1), two draws, one row: off
    by 0.0067 in the two-token law), and SpecTr saw two or three draws depending on whether
    the first two collided."""
    from draftwise.topology.compile import TreeLimits

    p_of, q_of = constant([1 / 3, 1 / 3, 1 / 3]), constant([0.6, 0.3, 0.1])
    want = target_law(p_of, 3, 2)
    tree = from_paths([(0,), (1,), (2,), (0, 0), (1, 0), (1, 1)])
    cases = [(SpecInferVerifier(), set_template(2), IID, TopologyKind.SET),
             (SpecTrVerifier(), set_template(3), IID, TopologyKind.SET),
             (SpecInferVerifier(), tree, IID, TopologyKind.TREE),
             (SequoiaVerifier(), tree, SamplingRelation.WITHOUT_REPLACEMENT, TopologyKind.TREE)]
    for verifier, template, relation, topology in cases:
        for max_nodes in range(1, len(template)):
            got = round_marginal(verifier, template, p_of, q_of, relation, 2, topology,
                                 limits=TreeLimits(max_nodes=max_nodes, max_depth=4))
            assert max_deviation(got, want) < TOL, (verifier.capabilities.name, len(template), max_nodes)
