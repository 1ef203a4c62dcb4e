"""Oracle registry and the exhaustive enumeration machinery."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise import oracles
from draftwise.runtime.contracts import SamplingRelation
from draftwise.oracles import registry
from draftwise.oracles.multi_candidate import (
    PAPER_P,
    PAPER_Q,
    constant,
    enumerate_outcomes,
    membership_lp_optimum,
    naive_retest_node,
    node_marginal,
    round_marginal,
    target_law,
)
from draftwise.verify.specinfer import SpecInferVerifier


def test_every_registered_oracle_passes():
    results = oracles.run_all()
    names = [r.name for r in results]
    assert len(names) == len(set(names)) >= 11
    failed = [r for r in results if not r.passed]
    assert not failed, "\n".join(f"{r.name}: {r.computed} vs {r.expected} ({r.detail})" for r in failed)


def test_register_appends_to_the_registry(monkeypatch):
    monkeypatch.setattr(registry, "ORACLES", [])
    fake = registry.OracleResult("fake", 1.0, 2.0, 0.1, False, "planted failure")
    registry.register(lambda: fake)
    assert registry.run_all() == [fake]


def test_enumerate_outcomes_is_exact_on_a_known_law():
    # two biased coins summed: P(0)=.6*.3, P(1)=.6*.7+.4*.3, P(2)=.4*.7
    law = enumerate_outcomes(lambda pick: pick(np.array([0.6, 0.4])) + pick(np.array([3.0, 7.0])))
    assert law == pytest.approx({0: 0.18, 1: 0.54, 2: 0.28})


def test_enumerate_outcomes_skips_zero_weight_branches():
    calls = []

    def run(pick):
        calls.append(1)
        return pick(np.array([0.0, 1.0, 0.0]))

    assert enumerate_outcomes(run) == {1: 1.0}
    assert len(calls) == 1


def test_naive_retest_law_is_the_known_wrong_one():
    out = node_marginal(naive_retest_node, np.array(PAPER_P), np.array(PAPER_Q), 2)
    np.testing.assert_allclose(out, [0.45, 0.33, 0.22], atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_duplicate_mass(k):
    p, q = np.array([0.5, 0.5]), np.array([0.0, 1.0])
    assert node_marginal(naive_retest_node, p, q, k)[1] == pytest.approx(1 - 2.0 ** -k, abs=1e-12)
    law = round_marginal(SpecInferVerifier(), tuple((i,) for i in range(k)), constant(p), constant(q),
                         SamplingRelation.IID, 1)
    assert law[(1,)] == pytest.approx(0.5, abs=1e-12)


def test_membership_lp_known_values():
    rng = np.random.default_rng(11)
    for _ in range(5):  # one draft: the best coupling accepts with 1 - TV = sum min(p, q)
        p, q = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
        assert membership_lp_optimum(p, q, 1) == pytest.approx(np.minimum(p, q).sum(), abs=1e-9)
    # the only candidate vector is (1, 1): acceptance is p(1)
    assert membership_lp_optimum(np.array([0.5, 0.5]), np.array([0.0, 1.0]), 2) == pytest.approx(0.5, abs=1e-9)
    assert membership_lp_optimum(np.array(PAPER_P), np.array(PAPER_Q), 2) == pytest.approx(1.0, abs=1e-9)


def test_target_law_sums_to_one_and_factorizes():
    p_of = lambda prefix: np.array([0.2, 0.8]) if not prefix else np.array([0.5, 0.5])  # noqa: E731
    law = target_law(p_of, 2, 2)
    assert sum(law.values()) == pytest.approx(1.0)
    assert law[(1, 0)] == pytest.approx(0.4)
