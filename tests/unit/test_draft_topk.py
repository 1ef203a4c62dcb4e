"""Top-k children of a draft-model tree: the k most probable ids, best first, ties to the
lower id, exactly what a full stable sort gives (without sorting the whole vocabulary)."""

import numpy as np
import pytest

from draftwise.proposers.draft_model import top_k_order


@pytest.mark.parametrize("seed", range(20))
def test_top_k_order_equals_a_stable_full_sort(seed):
    rng = np.random.default_rng(seed)
    probs = rng.random(64)
    probs[rng.integers(0, 64, 10)] = probs[5]  # plant ties, some at the top-k boundary
    for k in (1, 2, 4, 9, 64):
        assert top_k_order(probs, k).tolist() == np.argsort(-probs, kind="stable")[:k].tolist()


def test_top_k_order_of_a_flat_distribution_is_the_lowest_ids():
    assert top_k_order(np.full(10, 0.1), 3).tolist() == [0, 1, 2]
    assert top_k_order(np.array([0.2, 0.5, 0.3]), 5).tolist() == [1, 2, 0]  # k larger than V
