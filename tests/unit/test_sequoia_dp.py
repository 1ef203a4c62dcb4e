"""Sequoia DP: equal to brute force on every small budget; reconstruction round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from draftwise.optimize.acceptance import selected_child_probs
from draftwise.optimize.sequoia_dp import (
    brute_force,
    check_bound,
    enumerate_trees,
    expected_tokens,
    solve,
    tree_depth,
    validate_paths,
)

TOY_P = selected_child_probs([0.82, 0.48, 0.24])
P_VECTORS = {
    "toy": TOY_P,
    "flat": np.array([0.3, 0.25, 0.2, 0.15]),
    "steep": np.array([0.95, 0.03]),
    "single": np.array([0.6]),
    "non_monotone": np.array([0.2, 0.5, 0.1]),  # noisy measurement: slot 1 beats slot 0
    "zeros": np.array([0.7, 0.0, 0.2]),
    "depth_indexed": np.array([[0.8, 0.1, 0.05], [0.6, 0.2, 0.1], [0.3, 0.3, 0.3]]),
}
N_SMALL, D_SMALL = 7, 5


@pytest.mark.parametrize("name", sorted(P_VECTORS))
def test_dp_equals_brute_force(name):
    p = P_VECTORS[name]
    table = solve(p, N_SMALL, D_SMALL)
    for n in range(1, N_SMALL + 1):
        for d in range(D_SMALL + 1):
            brute, brute_paths = brute_force(p, n, d)
            if brute_paths is None:
                assert not table.feasible(n, d), (n, d)
                continue
            assert table.value(n, d) == pytest.approx(brute, rel=0, abs=1e-12), (n, d)
            paths = table.paths(n, d)
            # Reconstruction round trip: the tree has n nodes, fits d, and re-scores to T[n, d].
            assert len(paths) == n - 1 and tree_depth(paths) <= d
            assert validate_paths(paths) == paths
            assert expected_tokens(p, paths) == pytest.approx(table.value(n, d), rel=0, abs=1e-12)
            check_bound(table.value(n, d), n, d)


def test_ordered_tree_counts_are_catalan():
    for n in range(1, 8):
        trees = list(enumerate_trees(n))
        assert len(trees) == math.comb(2 * (n - 1), n - 1) // n  # Catalan(n - 1)
        assert len(set(trees)) == len(trees)


def test_toy_values_by_hand():
    table = solve(TOY_P, 8, 4)
    assert table.value(1, 0) == 1.0
    assert table.value(2, 1) == pytest.approx(1.82)
    assert table.value(3, 1) == pytest.approx(1 + 0.82 + 0.0864)  # two root slots
    assert table.value(5, 4) == pytest.approx(3.49588976, abs=1e-14)
    assert table.paths(5, 4) == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    assert not table.feasible(5, 1)  # width 3 cannot hold 4 children of the root
    assert not table.feasible(2, 0)
    assert not table.feasible(0, 3)


def test_values_monotone_in_depth_and_bounded():
    p = P_VECTORS["flat"]
    table = solve(p, 20, 6)
    vals = table.values  # [N+1, d+1]
    for n in range(1, 21):
        row = vals[n][np.isfinite(vals[n])]
        assert np.all(np.diff(row) >= -1e-15)  # a looser depth bound never hurts
        for d in range(7):
            if table.feasible(n, d):
                assert 1.0 <= table.value(n, d) <= min(n, d + 1)


def test_depth_indexed_differs_from_first_row():
    """Row 2 drives depth-2 children: a depth-indexed p must not be read as its first row."""
    p = np.array([[0.5, 0.1], [0.9, 0.05]])
    table = solve(p, 3, 2)
    assert table.value(3, 2) == pytest.approx(1 + 0.5 + 0.5 * 0.9)
    assert solve(p[0], 3, 2).value(3, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_large_budget_is_fast_and_sane():
    p = np.array([0.5, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01, 0.01])
    table = solve(p, 96, 10)
    paths = table.paths(96, 10)
    assert len(paths) == 95
    assert expected_tokens(p, paths) == pytest.approx(table.value(96, 10), abs=1e-12)


@pytest.mark.parametrize(
    "paths",
    [
        [(0, 0)],  # parent missing
        [(0, 0), (0,)],  # child before parent
        [(1,)],  # slot 1 without slot 0
        [(0,), (0,)],  # repeated
        [()],  # root is implicit
        [(0,), (-1,)],
    ],
)
def test_validate_paths_refuses(paths):
    with pytest.raises(ValueError):
        validate_paths(paths)


def test_expected_tokens_refuses_slot_beyond_width():
    with pytest.raises(ValueError, match="width"):
        expected_tokens([0.5, 0.2], [(0,), (1,), (2,)])


def test_check_bound_catches_impossible_values():
    with pytest.raises(AssertionError):
        check_bound(3.5, 3, 5)
    with pytest.raises(AssertionError):
        check_bound(2.5, 10, 1)
    with pytest.raises(AssertionError):
        check_bound(0.9, 1, 0)


def test_solve_refuses_bad_p_and_budget():
    with pytest.raises(ValueError):
        solve([0.82, 0.48, 0.24], 5, 3)  # conditional rates, sum > 1
    with pytest.raises(ValueError):
        solve(TOY_P, 0, 3)


def test_dp_paths_are_canonical_templates():
    """The engine compiles trees through topology.templates: DP output must already be canonical."""
    from draftwise.topology.templates import from_paths

    table = solve(P_VECTORS["flat"], 30, 6)
    for n, d in [(2, 1), (7, 3), (30, 6), (12, 2)]:
        paths = table.paths(n, d)
        assert from_paths(paths) == paths
