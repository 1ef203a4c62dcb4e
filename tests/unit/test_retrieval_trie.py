"""Prefix-count tries and node-budget pruning against hand-worked examples."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.proposers.retrieval.trie import PAD, build_trie, prune


def rows(*continuations: list[int], length: int | None = None) -> np.ndarray:
    length = length or max(len(c) for c in continuations)
    return np.array([c + [PAD] * (length - len(c)) for c in continuations], dtype=np.int64)


def listing(trie) -> list[tuple[tuple[int, ...], int]]:
    return [(trie.path(i), int(trie.count[i])) for i in range(trie.size)]


def test_fixture_trie_keeps_recurring_token_under_another_prefix_apart():
    trie = build_trie(rows([9, 4, 5, 6, 10, 11], [10, 11], length=8))
    root = trie.children(-1)
    assert [int(trie.tokens[i]) for i in root] == [9, 10]
    assert [int(trie.count[i]) for i in root] == [1, 1]
    tens = [i for i in range(trie.size) if trie.tokens[i] == 10]
    assert sorted(trie.path(i) for i in tens) == [(9, 4, 5, 6, 10), (10,)]
    assert trie.size == 8


# hand-worked: continuations 1-2-3, 1-2-4, 1-5, 6
#   root ── 1 (3) ── 2 (2) ── 3 (1)
#        │        │        └─ 4 (1)
#        │        └─ 5 (1)
#        └─ 6 (1)
HAND = rows([1, 2, 3], [1, 2, 4], [1, 5], [6])


def test_prefix_counts_and_canonical_breadth_first_order():
    assert listing(build_trie(HAND)) == [
        ((1,), 3), ((6,), 1),
        ((1, 2), 2), ((1, 5), 1),
        ((1, 2, 3), 1), ((1, 2, 4), 1),
    ]


def test_siblings_by_count_descending_then_token_ascending():
    trie = build_trie(rows([7], [3], [7], [5], [3], [7], [2]))
    assert listing(trie) == [((7,), 3), ((3,), 2), ((2,), 1), ((5,), 1)]


def test_parents_come_first_and_depth_counts_from_one():
    trie = build_trie(HAND)
    for i in range(trie.size):
        p = int(trie.parent[i])
        assert p < i
        assert trie.depth[i] == (1 if p == -1 else trie.depth[p] + 1)


@pytest.mark.parametrize(
    "budget, kept",
    [
        (0, []),
        (1, [(1,)]),
        (2, [(1,), (1, 2)]),
        # count-1 ties: the shallower node (6, depth 1) wins over the depth-2/3 ones
        (3, [(1,), (6,), (1, 2)]),
        # then breadth-first order: 1-5 before 1-2-3 and 1-2-4
        (4, [(1,), (6,), (1, 2), (1, 5)]),
        (5, [(1,), (6,), (1, 2), (1, 5), (1, 2, 3)]),
        (6, [(1,), (6,), (1, 2), (1, 5), (1, 2, 3), (1, 2, 4)]),
        (99, [(1,), (6,), (1, 2), (1, 5), (1, 2, 3), (1, 2, 4)]),
    ],
)
def test_pruning_hand_worked(budget, kept):
    pruned = prune(build_trie(HAND), budget)
    assert [pruned.path(i) for i in range(pruned.size)] == kept


def test_pruning_is_ancestor_closed_and_keeps_the_highest_counts():
    rng = np.random.default_rng(3)
    for _ in range(30):
        data = rng.integers(0, 4, size=(int(rng.integers(1, 40)), 6))
        cut = rng.integers(1, 7, size=data.shape[0])
        data[np.arange(6)[None, :] >= cut[:, None]] = PAD
        trie = build_trie(data)
        full = {trie.path(i): int(trie.count[i]) for i in range(trie.size)}
        for budget in range(trie.size + 1):
            pruned = prune(trie, budget)
            paths = {pruned.path(i) for i in range(pruned.size)}
            assert pruned.size == min(budget, trie.size)
            assert all(p[:-1] in paths or len(p) == 1 for p in paths)
            dropped = [c for p, c in full.items() if p not in paths]
            if paths and dropped:
                assert min(full[p] for p in paths) >= max(dropped)


def test_prune_rejects_negative_budget():
    with pytest.raises(ValueError):
        prune(build_trie(HAND), -1)


def test_empty_input_gives_empty_trie():
    assert build_trie(np.zeros((0, 8), dtype=np.int64)).size == 0
    assert build_trie(rows([PAD, PAD])).size == 0


def reference_trie(continuations: np.ndarray) -> list[tuple[tuple[int, ...], int, int]]:
    """Oracle: dict walk, then breadth-first with siblings by (-count, token)."""
    counts: dict[tuple[int, ...], int] = {}
    for row in continuations.tolist():
        path: tuple[int, ...] = ()
        for token in row:
            if token == PAD:
                break
            path += (token,)
            counts[path] = counts.get(path, 0) + 1

    def key(path):  # breadth-first: depth, then the ancestors' sibling ranks, root side first
        return (len(path), [(-counts[path[: i + 1]], path[i]) for i in range(len(path))])

    return [(p, counts[p], len(p)) for p in sorted(counts, key=key)]


def test_vectorized_trie_matches_the_dict_oracle():
    rng = np.random.default_rng(7)
    for _ in range(200):
        k, length = int(rng.integers(1, 65)), int(rng.integers(1, 9))
        data = rng.integers(0, int(rng.integers(1, 6)), size=(k, length))
        cut = rng.integers(0, length + 1, size=k)
        data[np.arange(length)[None, :] >= cut[:, None]] = PAD
        trie = build_trie(data)
        got = [(trie.path(i), int(trie.count[i]), int(trie.depth[i])) for i in range(trie.size)]
        assert got == reference_trie(data)
        assert all(trie.parent[i] < i for i in range(trie.size))
