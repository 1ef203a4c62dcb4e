import numpy as np
import pytest

from draftwise.sampling import PolicyError, SamplingPolicy, sample


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
