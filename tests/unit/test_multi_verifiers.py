"""Multi-candidate verifiers on hand-built compiled rounds with hand-computed outcomes."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.runtime.contracts import (
    ContractError,
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)
from draftwise.oracles.multi_candidate import enumerate_outcomes
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import compile_round
from draftwise.verify.base import IncompatibleVerifier, NumpyLogits, bind
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.rejection import RejectionVerifier, residual
from draftwise.verify.sequoia import SequoiaVerifier, sequoia_node, without_replacement_q
from draftwise.verify.specinfer import SpecInferVerifier, specinfer_node
from draftwise.verify.spectr import SpecTrVerifier, spectr_node, spectr_rho
from draftwise.verify.typical import TypicalVerifier, entropy, typical_threshold

T1 = SamplingPolicy(temperature=1.0)
NC = ProbabilitySemantics.NORMALIZED_CONDITIONAL
IID = SamplingRelation.IID
WOR = SamplingRelation.WITHOUT_REPLACEMENT


def build(nodes, dists, relation=IID, topology=TopologyKind.TREE, semantics=NC):
    """nodes: (token, parent node index); dists: parent node index -> q [V]."""
    depth: list[int] = []
    props = []
    for token, parent in nodes:
        depth.append(1 if parent == -1 else depth[parent] + 1)
        q = None if semantics is not NC else float(dists[parent][token])
        props.append(ProposalNode(token=token, parent=parent, depth=depth[-1], q=q, source="d"))
    contract = ProposerContract(semantics, relation, topology)
    dist_map = {k: np.asarray(v, dtype=np.float64) for k, v in dists.items()} if semantics is NC else {}
    return compile_round(5, [ProposalResult(tuple(props), contract, "d", "h", dist_map)])


def target(rows):
    """rows: [1 + N] distributions, row 0 = frontier; logits = log p, so T = 1 gives p back."""
    with np.errstate(divide="ignore"):
        return NumpyLogits(np.log(np.asarray(rows, dtype=np.float64)))


def selection_law(verifier, round_, tgt, policy=T1):
    return enumerate_outcomes(lambda pick: verifier.select_with(round_, tgt, policy, pick))


def accepted_law(verifier, round_, tgt):
    law: dict[tuple[int, ...], float] = {}
    for sel, prob in selection_law(verifier, round_, tgt).items():
        law[sel.accepted_rows] = law.get(sel.accepted_rows, 0.0) + prob
    return law


# ------------------------------------------------------------------ negotiation


def _contract(relation, topology):
    return ProposerContract(NC, relation, topology)


def test_capabilities_follow_the_negotiation_table():
    spec = {
        "rejection": (RejectionVerifier, {IID}, {TopologyKind.SEQUENCE}, True),
        "specinfer": (SpecInferVerifier, {IID}, {TopologyKind.TREE}, True),
        "sequoia": (SequoiaVerifier, {WOR}, {TopologyKind.TREE, TopologyKind.SET}, True),
        "spectr": (SpecTrVerifier, {IID}, {TopologyKind.SET}, True),
    }
    for name, (cls, relations, topologies, exact) in spec.items():
        caps = cls.capabilities
        assert caps.name == name
        assert caps.semantics == frozenset({NC})
        assert caps.relations == frozenset(relations)
        assert caps.topologies == frozenset(topologies)
        assert caps.exact is exact and caps.single_source and not caps.greedy_only
    typical = TypicalVerifier.capabilities
    assert typical.exact is False
    assert typical.topologies == frozenset({TopologyKind.TREE})
    assert typical.semantics == frozenset(ProbabilitySemantics)
    assert typical.relations == frozenset(SamplingRelation)


@pytest.mark.parametrize(
    "verifier, contract",
    [
        (SpecInferVerifier(), _contract(WOR, TopologyKind.TREE)),  # drafts were not i.i.d.
        (SequoiaVerifier(), _contract(IID, TopologyKind.TREE)),  # removals would be invented
        (SpecTrVerifier(), _contract(IID, TopologyKind.TREE)),  # K-SEQ is a one-position rule
        (SpecInferVerifier(), ProposerContract(ProbabilitySemantics.FREQUENCY, IID, TopologyKind.TREE)),
    ],
)
def test_bind_refuses_mismatched_contracts(verifier, contract):
    with pytest.raises(IncompatibleVerifier):
        bind(verifier, [contract], T1)


def test_bind_accepts_matching_contracts_and_refuses_typical_in_exact_mode():
    assert bind(SpecInferVerifier(), [_contract(IID, TopologyKind.TREE)], T1) is not None
    assert bind(SequoiaVerifier(), [_contract(WOR, TopologyKind.TREE)], T1) is not None
    assert bind(SpecTrVerifier(), [_contract(IID, TopologyKind.SET)], T1) is not None
    with pytest.raises(IncompatibleVerifier, match="heuristic"):
        bind(TypicalVerifier(), [_contract(IID, TopologyKind.TREE)], T1)
    assert bind(TypicalVerifier(), [_contract(IID, TopologyKind.TREE)], T1, exact=False) is not None
    with pytest.raises(IncompatibleVerifier, match="one proposal distribution"):
        bind(SpecInferVerifier(), [_contract(IID, TopologyKind.TREE)] * 2, T1)


# ------------------------------------------------------------------ SpecInfer


def test_specinfer_residual_steers_to_the_second_draft():
    # p is one-hot at 2: draft 0 is rejected for sure, the residual is one-hot at 2, draft 2 accepted
    q = [1 / 3, 1 / 3, 1 / 3]
    round_ = build([(0, -1), (2, -1)], {-1: q})
    tgt = target([[0, 0, 1], [1, 0, 0], [0, 1, 0]])  # row of token 2 predicts token 1
    for seed in range(10):
        sel = SpecInferVerifier().select(round_, tgt, T1, np.random.default_rng(seed))
        assert sel.accepted_rows == (1,) and sel.bonus_token == 1


def test_specinfer_tests_every_duplicate_draw():
    # drafts (2, 2) merge into one row; p(2) = 0 rejects both, and the second rejection moves
    # the residual from (1/2, 1/2, 0) to (0, 1, 0): testing only the distinct row would emit 0 half the time
    p, q = [0.7, 0.3, 0.0], [0.5, 0.1, 0.4]
    round_ = build([(2, -1), (2, -1)], {-1: q})
    assert round_.n == 1
    tgt = target([p, [1, 0, 0]])
    law = selection_law(SpecInferVerifier(), round_, tgt)
    assert len(law) == 1
    (sel,) = law
    assert sel.accepted_rows == () and sel.bonus_token == 1


def test_specinfer_hand_computed_law_and_descent():
    # p=(.5,.3,.2), q=(.4,.4,.2), drafts (1, 0): accept 1 w.p. .3/.4; else residual (1,0,0) accepts 0
    p, q = [0.5, 0.3, 0.2], [0.4, 0.4, 0.2]
    round_ = build([(1, -1), (0, -1), (2, 0)], {-1: q, 0: [0.0, 0.0, 1.0]})
    child_p = [0.0, 0.0, 1.0]  # under token 1 the target agrees with the one-hot draft
    tgt = target([p, child_p, [1, 0, 0], [0, 1, 0]])
    law = accepted_law(SpecInferVerifier(), round_, tgt)
    assert law == pytest.approx({(0, 2): 0.75, (1,): 0.25}, abs=1e-12)


def test_specinfer_node_matches_rejection_for_one_draft():
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.25, 0.25])
    d = specinfer_node(p, q, [0])
    assert d.accept[0] == pytest.approx(0.2)
    np.testing.assert_allclose(d.residual, residual(p, q))


def test_select_with_rng_matches_p_in_frequency():
    p, q = [0.5, 0.3, 0.2], [0.4, 0.4, 0.2]
    rng = np.random.default_rng(0)
    counts = np.zeros(3)
    for _ in range(3000):
        drafts = rng.choice(3, size=2, p=q)
        round_ = build([(int(drafts[0]), -1), (int(drafts[1]), -1)], {-1: q})
        tgt = target([p] + [[1 / 3] * 3] * round_.n)
        sel = SpecInferVerifier().select(round_, tgt, T1, rng)
        first = int(round_.token_ids[sel.accepted_rows[0]]) if sel.accepted_rows else sel.bonus_token
        counts[first] += 1
    # 3000 draws: binomial sd <= 0.0092, so 0.04 is > 4 sd
    np.testing.assert_allclose(counts / counts.sum(), p, atol=0.04)


def test_exact_verifiers_reduce_to_greedy_at_temperature_zero():
    greedy = SamplingPolicy(temperature=0.0)
    rng = np.random.default_rng(3)
    for _ in range(20):
        logits = rng.normal(size=(4, 5))  # frontier + 3 rows
        tokens = [int(t) for t in rng.integers(0, 5, size=3)]
        one_hot = [np.eye(5)[t] for t in tokens]  # q under the greedy policy is one-hot at the draft
        round_ = build([(tokens[0], -1), (tokens[1], 0), (tokens[2], 1)], {-1: one_hot[0], 0: one_hot[1],
                                                                              1: one_hot[2]})
        tgt = NumpyLogits(logits)
        want = GreedyVerifier().select(round_, tgt, greedy, rng)
        for verifier in (SpecInferVerifier(), SequoiaVerifier()):
            assert verifier.select(round_, tgt, greedy, rng) == want


def test_multi_source_rounds_are_refused():
    contract = _contract(IID, TopologyKind.TREE)
    a = ProposalResult((ProposalNode(0, -1, 1, q=0.5, source="a"),), contract, "a", "h", {-1: np.array([0.5, 0.5])})
    b = ProposalResult((ProposalNode(1, -1, 1, q=0.5, source="b"),), contract, "b", "h", {-1: np.array([0.5, 0.5])})
    round_ = compile_round(3, [a, b])
    with pytest.raises(ContractError, match="several proposers"):
        SpecInferVerifier().select(round_, target([[0.5, 0.5]] * 3), T1, np.random.default_rng(0))


def test_q_zero_draft_is_refused():
    with pytest.raises(ContractError, match="q = 0"):
        specinfer_node(np.array([0.5, 0.5]), np.array([1.0, 0.0]), [1])


# ------------------------------------------------------------------ Sequoia


def test_without_replacement_q_removes_and_falls_back_to_uniform():
    q = np.array([0.0, 0.6, 0.4, 0.0])
    np.testing.assert_allclose(without_replacement_q(q, [1]), [0, 0, 1, 0])
    np.testing.assert_allclose(without_replacement_q(q, [1, 2]), [0.5, 0, 0, 0.5])  # q exhausted
    np.testing.assert_allclose(without_replacement_q(q, [1, 2, 0]), [0, 0, 0, 1])
    with pytest.raises(ContractError, match="whole vocabulary"):
        without_replacement_q(q, [0, 1, 2, 3])


def test_sequoia_hand_computed_law_with_uniform_fallback():
    # q one-hot at 1: draft 1 accepted w.p. .25; residual (1/3, 0, 2/3) vs the uniform fallback
    # (1/2, 0, 1/2) over unsampled tokens accepts draft 2 surely
    p, q = [0.25, 0.25, 0.5], [0.0, 1.0, 0.0]
    round_ = build([(1, -1), (2, -1)], {-1: q}, relation=WOR)
    tgt = target([p, [1, 0, 0], [1, 0, 0]])
    assert accepted_law(SequoiaVerifier(), round_, tgt) == pytest.approx({(0,): 0.25, (1,): 0.75}, abs=1e-12)
    d = sequoia_node(np.array(p), np.array(q), [1, 0])
    # draft 0 against residual (1/3, 0, 2/3) and fallback (1/2, 0, 1/2): accepted w.p. 2/3
    assert d.accept == pytest.approx([0.25, 0.75 * 2 / 3])
    np.testing.assert_allclose(d.residual, [0, 0, 1], atol=1e-12)


def test_sequoia_refuses_duplicate_siblings():
    with pytest.raises(ContractError, match="drawn twice"):
        sequoia_node(np.array([0.5, 0.5]), np.array([0.5, 0.5]), [0, 0])


# ------------------------------------------------------------------ SpecTr


def test_spectr_one_draft_is_rejection_sampling():
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.25, 0.25])
    assert spectr_rho(p, q, 1) == 1.0
    d = spectr_node(p, q, [2])
    assert d.accept[0] == pytest.approx(1.0)
    d = spectr_node(p, q, [0])
    assert d.accept[0] == pytest.approx(0.2)
    np.testing.assert_allclose(d.residual, residual(p, q))


def test_spectr_rho_is_feasible_and_tight():
    rng = np.random.default_rng(7)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
        k = int(rng.integers(2, 5))
        rho = spectr_rho(p, q, k)
        assert 1.0 <= rho <= k
        beta = np.minimum(q, p / rho).sum()
        assert rho * beta >= 1 - (1 - beta) ** k - 1e-12  # residual non-negative
        if rho > 1.0:  # a visibly smaller rho must be infeasible (rho is the smallest)
            r2 = rho - 1e-6
            b2 = np.minimum(q, p / r2).sum()
            assert r2 * b2 < 1 - (1 - b2) ** k


def test_spectr_identical_distributions_accept_the_first_draft():
    p = np.array([0.2, 0.3, 0.5])
    d = spectr_node(p, p, [2, 0, 1])
    np.testing.assert_allclose(d.accept, [1.0, 0.0, 0.0])


def test_spectr_refuses_a_tree():
    q = [0.5, 0.5]
    round_ = build([(0, -1), (1, 0)], {-1: q, 0: q})
    with pytest.raises(ContractError, match="one-position set"):
        SpecTrVerifier().select(round_, target([q] * 3), T1, np.random.default_rng(0))


def test_spectr_set_law_on_a_hand_built_round():
    # p = q: rho = 1 and the first draft is always accepted, whatever the second is
    p = [0.5, 0.5]
    round_ = build([(1, -1), (0, -1)], {-1: p}, topology=TopologyKind.SET)
    assert accepted_law(SpecTrVerifier(), round_, target([p, p, p])) == pytest.approx({(0,): 1.0})


# ------------------------------------------------------------------ typical acceptance


def test_typical_threshold_matches_medusa_rule():
    p = np.array([0.6, 0.35, 0.05])
    h = -(0.6 * np.log(0.6) + 0.35 * np.log(0.35) + 0.05 * np.log(0.05))
    assert entropy(p) == pytest.approx(h)
    assert typical_threshold(p, 0.09, 0.3) == pytest.approx(min(0.09, 0.3 * np.exp(-h)))
    flat = np.full(8, 1 / 8)  # high entropy: the entropy term (0.3/8) is below epsilon
    assert typical_threshold(flat, 0.09, 0.3) == pytest.approx(0.3 / 8)


def test_typical_takes_the_longest_accepted_path():
    # frontier p=(.6,.35,.05): token 2 (.05 < .09) fails, token 1 passes, token 0 passes;
    # under token 1 a child passes, under token 0 none does -> the depth-2 path through 1 wins
    round_ = build([(0, -1), (2, -1), (1, -1), (1, 0), (0, 2), (2, 4)],
                   {-1: [1 / 3] * 3, 0: [1 / 3] * 3, 2: [1 / 3] * 3, 4: [1 / 3] * 3},
                   semantics=ProbabilitySemantics.SCORE_ONLY)
    rows = [
        [0.6, 0.35, 0.05],  # frontier
        [0.9, 0.05, 0.05],  # under token 0: its child 1 has .05 -> fails
        [1 / 3] * 3,  # under token 2 (never reached)
        [0.95, 0.04, 0.01],  # under token 1: child 0 passes
        [1 / 3] * 3,
        [0.01, 0.01, 0.98],  # under 1,0: child 2 passes
        [0.0, 1.0, 0.0],  # under 1,0,2: bonus
    ]
    sel = TypicalVerifier().select(round_, target(rows), T1, np.random.default_rng(0))
    path = [round_.path_tokens(r)[-1] for r in sel.accepted_rows]
    assert path == [1, 0, 2]
    assert sel.bonus_token == 1


def test_typical_accepts_nothing_when_every_child_is_implausible():
    round_ = build([(2, -1)], {-1: [1, 0, 0]}, semantics=ProbabilitySemantics.SCORE_ONLY)
    sel = TypicalVerifier().select(round_, target([[0.99, 0.0, 0.01], [1, 0, 0]]), T1, np.random.default_rng(0))
    assert sel.accepted_rows == () and sel.bonus_token == 0


def test_typical_is_greedy_at_temperature_zero():
    greedy = SamplingPolicy(temperature=0.0)
    rng = np.random.default_rng(5)
    for _ in range(10):
        logits = rng.normal(size=(4, 4))
        tokens = [int(t) for t in rng.integers(0, 4, size=3)]
        round_ = build([(tokens[0], -1), (tokens[1], 0), (tokens[2], -1)], {},
                       semantics=ProbabilitySemantics.SCORE_ONLY)
        tgt = NumpyLogits(logits)
        assert TypicalVerifier().select(round_, tgt, greedy, rng) == GreedyVerifier().select(round_, tgt, greedy, rng)
