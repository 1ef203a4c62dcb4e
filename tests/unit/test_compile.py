import dataclasses

import numpy as np
import pytest

from draftwise.topology.compile import GraphError, TreeLimits, compile_round, validate_candidate_graph
from tests.helpers import result_from_paths

A, B, C, D, E, F, X = 10, 11, 12, 13, 14, 15, 16


def design_fixture():
    hydra = result_from_paths([[A, B, C], [A, B, D], [X, B]], source="hydra")
    rest = result_from_paths([[A, B, E], [A, F]], source="rest")
    return [hydra, rest]


def test_design_fixture_merges_by_full_prefix():
    results = design_fixture()
    r = compile_round(prefix_len=5, results=results)
    validate_candidate_graph(r, results)
    # A, A-B, A-B-C, A-B-D, X, X-B, A-B-E, A-F: the two B rows stay distinct.  (A (depth, token)
    # merge would give 7 rows by fusing A-B and X-B; the full-prefix trie has 8.)
    assert r.n == 8
    b_rows = [i for i in range(r.n) if r.token_ids[i] == B]
    assert len(b_rows) == 2
    b_under_a, b_under_x = sorted(b_rows, key=lambda i: r.token_ids[r.parent[i]])
    assert r.token_ids[r.parent[b_under_a]] == A and r.token_ids[r.parent[b_under_x]] == X
    assert not np.array_equal(r.ancestor_mask[b_under_a], r.ancestor_mask[b_under_x])
    c_row = int(np.flatnonzero(r.token_ids == C)[0])
    d_row = int(np.flatnonzero(r.token_ids == D)[0])
    assert r.parent[c_row] == r.parent[d_row] == b_under_a
    e_row = int(np.flatnonzero(r.token_ids == E)[0])
    assert r.parent[e_row] == b_under_a  # REST's A-B-E lands under Hydra's A-B
    assert r.sources == ("hydra", "rest")


def test_positions_and_mask():
    r = compile_round(prefix_len=7, results=design_fixture())
    assert np.array_equal(r.position_ids, 7 + r.depth - 1)
    for i in range(r.n):
        for j in range(r.n):
            siblings = r.parent[i] == r.parent[j] and i != j
            if siblings:
                assert not r.ancestor_mask[i, j]


def _replace(r, **changes):
    return dataclasses.replace(r, **changes)


@pytest.fixture
def compiled():
    results = design_fixture()
    return compile_round(prefix_len=5, results=results), results


def test_planted_child_before_parent(compiled):
    r, _ = compiled
    order = np.arange(r.n)[::-1].copy()
    inverse = np.argsort(order)
    parent = np.where(r.parent[order] >= 0, inverse[r.parent[order]], -1)
    bad = _replace(r, token_ids=r.token_ids[order], parent=parent, depth=r.depth[order],
                   position_ids=r.position_ids[order],
                   ancestor_mask=r.ancestor_mask[np.ix_(order, order)])
    with pytest.raises(GraphError, match="before its parent"):
        validate_candidate_graph(bad)


def test_planted_parent_shift(compiled):
    # the classic one-row offset: every row scored by the row after its parent
    r, _ = compiled
    shifted = r.parent.copy()
    shifted[shifted >= 0] += 1
    with pytest.raises(GraphError):
        validate_candidate_graph(_replace(r, parent=shifted))


def test_planted_sibling_visible(compiled):
    r, _ = compiled
    mask = r.ancestor_mask.copy()
    c_row = int(np.flatnonzero(r.token_ids == C)[0])
    d_row = int(np.flatnonzero(r.token_ids == D)[0])
    mask[d_row, c_row] = True
    with pytest.raises(GraphError, match="mask is wrong"):
        validate_candidate_graph(_replace(r, ancestor_mask=mask))


def test_planted_depth_position_mismatch(compiled):
    r, _ = compiled
    with pytest.raises(GraphError, match="position"):
        validate_candidate_graph(_replace(r, position_ids=r.position_ids + 1))
    depth = r.depth.copy()
    depth[3] += 1
    with pytest.raises(GraphError, match="depth"):
        validate_candidate_graph(_replace(r, depth=depth))


def test_planted_different_prefixes_merged(compiled):
    r, results = compiled
    # Re-point X's child B at A's B row, as a (depth, token) merge would.
    x_row = int(np.flatnonzero(r.token_ids == X)[0])
    b_rows = [i for i in range(r.n) if r.token_ids[i] == B]
    b_under_a = next(i for i in b_rows if r.parent[i] != x_row)
    b_under_x = next(i for i in b_rows if r.parent[i] == x_row)
    origin = list(list(o) for o in r.origin)
    origin[0] = [b_under_a if row == b_under_x else row for row in origin[0]]
    with pytest.raises(GraphError, match="different full prefixes were merged"):
        validate_candidate_graph(_replace(r, origin=tuple(tuple(o) for o in origin)), results)


def test_duplicate_rows_detected(compiled):
    r, _ = compiled
    tokens = r.token_ids.copy()
    a_row = int(np.flatnonzero(r.token_ids == A)[0])
    x_row = int(np.flatnonzero(r.token_ids == X)[0])
    tokens[x_row] = tokens[a_row]
    with pytest.raises(GraphError, match="same full prefix"):
        validate_candidate_graph(_replace(r, token_ids=tokens))


def test_limits_drop_subtrees():
    results = design_fixture()
    r = compile_round(5, results, TreeLimits(max_nodes=64, max_depth=2))
    validate_candidate_graph(r, results)
    assert r.depth.max() == 2
    r = compile_round(5, results, TreeLimits(max_nodes=3, max_depth=16))
    validate_candidate_graph(r, results)
    assert r.n == 3


def test_the_node_budget_counts_merged_nodes_so_what_survives_never_depends_on_tokens():
    # two draws of token 7 and one of 8 at the frontier, then a child of the repeated 7
    result = result_from_paths([[7], [8], [7, 9]])
    duplicate = dataclasses.replace(result.nodes[0])
    nodes = (result.nodes[0], result.nodes[1], duplicate, dataclasses.replace(result.nodes[2], parent=2))
    result = dataclasses.replace(result, nodes=nodes)
    full = compile_round(5, [result], TreeLimits(max_nodes=4, max_depth=16))
    assert full.origin[0] == (0, 1, 0, 2)  # the repeat merges into row 0, its child hangs there
    # three nodes allowed: the repeat takes the third place though it needs no row, so the
    # child is cut (counting rows, 2 < 3, would have kept it: a cut decided by the tokens drawn)
    assert compile_round(5, [result], TreeLimits(max_nodes=3, max_depth=16)).origin[0] == (0, 1, 0, -2)
    assert compile_round(5, [result], TreeLimits(max_nodes=1, max_depth=16)).origin[0] == (0, -2, -2, -2)


def test_empty_round():
    r = compile_round(3, [])
    assert r.n == 0 and r.children_of(-1) == ()
