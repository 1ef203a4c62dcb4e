import numpy as np
import pytest

from draftwise.errors import InputError
from draftwise.runtime.sampling import PolicyError, PositionDraws, SamplingPolicy, sample, sample_with


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top-p"), (dict(top_p=1.5), "top-p"),
    (dict(top_k=-1), "top-k"),
])
def test_invalid_policies(kwargs, match):
    with pytest.raises(PolicyError, match=match):
        SamplingPolicy(**kwargs)


def test_greedy_is_one_hot_at_first_argmax():
    probs = SamplingPolicy().probs(np.array([1.0, 3.0, 3.0, 0.0]))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_temperature_top_k_top_p_by_hand():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.allclose(SamplingPolicy(temperature=1.0).probs(logits), [0.5, 0.3, 0.15, 0.05])
    assert np.allclose(SamplingPolicy(temperature=1.0, top_k=2).probs(logits), [0.625, 0.375, 0, 0])
    # top-p 0.75: the ascending tail 0.05 + 0.15 <= 0.25 is cut
    assert np.allclose(SamplingPolicy(temperature=1.0, top_p=0.75).probs(logits), [0.625, 0.375, 0, 0])
    assert np.allclose(SamplingPolicy(temperature=1.0, top_p=0.81).probs(logits), np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    hot = SamplingPolicy(temperature=2.0).probs(logits)
    expected = np.sqrt([0.5, 0.3, 0.15, 0.05])
    assert np.allclose(hot, expected / expected.sum())


def test_sample_matches_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(p, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0.0
    assert np.allclose(draws, p, atol=0.015)


def test_sample_with_inverts_the_cdf_at_its_boundaries():
    p = np.array([0.25, 0.0, 0.5, 0.25])
    assert [sample_with(p, u) for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999)] == [0, 0, 2, 2, 3, 3]


def test_position_draws_are_a_pure_function_of_key_and_position():
    draws = PositionDraws(7)
    forward = [draws.uniform(p) for p in range(50)]
    backward = [PositionDraws(7).uniform(p) for p in reversed(range(50))][::-1]
    assert forward == backward  # whatever was asked before, in whatever order
    assert forward != [PositionDraws(8).uniform(p) for p in range(50)]
    assert len(set(forward)) == 50 and all(0.0 <= u < 1.0 for u in forward)
    assert PositionDraws.for_seed(7, np.random.default_rng(0)) == draws
    with pytest.raises(InputError, match="position"):
        draws.uniform(-1)
    with pytest.raises(InputError, match="64-bit"):
        PositionDraws(-1)


def test_position_draws_are_uniform_and_independent_across_positions():
    """Kolmogorov-Smirnov on 4000 draws of one key, and the correlation of neighbouring positions."""
    from scipy import stats

    u = np.array([PositionDraws(3).uniform(p) for p in range(4000)])
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.06
    across_keys = np.array([PositionDraws(k).uniform(10) for k in range(4000)])
    assert stats.kstest(across_keys, "uniform").pvalue > 1e-3


def test_an_unseeded_request_draws_a_key_of_its_own():
    rng = np.random.default_rng()
    assert len({PositionDraws.for_seed(None, rng).key for _ in range(20)}) == 20
