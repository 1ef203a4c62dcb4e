"""A trie of retrieved continuations with prefix counts, and node-budget pruning.

Nodes are keyed by their FULL prefix: a token that recurs under another path is another
node.  A node's count is the number of continuations that pass through it (a prefix count),
so a child never counts more than its parent.

Canonical node order (breadth-first): depth ascending; within a depth, the parent's order,
then count descending, then token id ascending.  The arrays are stored in that order, so
parents always come before their children and sibling order is the documented one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD = -1  # fills a continuation row after its end (document boundary or index end)
SIBLING_ORDER = "count descending, then token id ascending"
PRUNING_POLICY = (
    "global node budget: keep the highest-count nodes; ties by depth ascending, then canonical "
    "breadth-first order (siblings by count descending, token id ascending); prefix counts make "
    "the kept set ancestor-closed"
)
COUNTER_DTYPE = np.int32  # a count is at most the number of retrieved matches


@dataclass(frozen=True, eq=False)
class Trie:
    """Arrays in canonical breadth-first order; `parent` is -1 for children of the root."""

    tokens: np.ndarray  # [N] int64
    parent: np.ndarray  # [N] int64, parent index < own index
    depth: np.ndarray  # [N] int64, 1 for children of the root
    count: np.ndarray  # [N] int32, prefix count

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def children(self, node: int) -> list[int]:
        """Indices of `node`'s children (-1: the root's) in sibling order."""
        return np.nonzero(self.parent == node)[0].tolist()

    def path(self, node: int) -> tuple[int, ...]:
        tokens: list[int] = []
        while node != -1:
            tokens.append(int(self.tokens[node]))
            node = int(self.parent[node])
        return tuple(reversed(tokens))


def empty_trie() -> Trie:
    none = np.zeros(0, dtype=np.int64)
    return Trie(none, none, none, np.zeros(0, dtype=COUNTER_DTYPE))


def build_trie(continuations: np.ndarray) -> Trie:
    """Trie of the rows of `continuations` [K, L] (int64, PAD after each row's end).

    Plain dicts, not numpy: at K = 64 rows of L = 8 tokens this is ~7x faster than one
    vectorized grouping pass per depth (measured: 0.07 ms vs 0.45 ms per query, p50).
    """
    children: dict[int, dict[int, int]] = {}  # node (-1: root) -> {token: child}, insertion ids
    tokens: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    for row in continuations.tolist():
        node = -1
        for token in row:
            if token == PAD:
                break
            kids = children.setdefault(node, {})
            child = kids.get(token)
            if child is None:
                child = kids[token] = len(tokens)
                tokens.append(token)
                parents.append(node)
                counts.append(0)
            counts[child] += 1
            node = child
    order = _canonical_order(children, tokens, counts)
    if not order:
        return empty_trie()
    new_id = {old: i for i, old in enumerate(order)}
    new_id[-1] = -1
    parent = [new_id[parents[o]] for o in order]
    depth: list[int] = []
    for p in parent:  # parents come first, so their depth is known
        depth.append(1 if p == -1 else depth[p] + 1)
    return Trie(
        np.array([tokens[o] for o in order], dtype=np.int64),
        np.array(parent, dtype=np.int64),
        np.array(depth, dtype=np.int64),
        np.array([counts[o] for o in order], dtype=COUNTER_DTYPE),
    )


def _canonical_order(children: dict[int, dict[int, int]], tokens: list[int], counts: list[int]) -> list[int]:
    """Breadth-first, siblings by count descending then token ascending."""
    order: list[int] = []
    frontier = [-1]
    while frontier:
        level: list[int] = []
        for node in frontier:
            kids = children.get(node)
            if kids:
                level.extend(sorted(kids.values(), key=lambda c: (-counts[c], tokens[c])))
        order.extend(level)
        frontier = level
    return order


def prune(trie: Trie, budget: int) -> Trie:
    """Keep at most `budget` nodes: the highest counts, ancestor-closed, in canonical order."""
    if budget < 0:
        raise ValueError(f"node budget must be >= 0, got {budget}")
    if trie.size <= budget:
        return trie
    n = trie.size
    # rank by (-count, depth, canonical index): a parent always ranks before its children,
    # because its count is >= theirs and its depth is smaller
    ranking = np.lexsort((np.arange(n), trie.depth, -trie.count.astype(np.int64)))
    keep = np.zeros(n, dtype=bool)
    keep[ranking[:budget]] = True
    kept = np.nonzero(keep)[0]  # canonical order preserved
    parents = trie.parent[kept]
    if not np.all(keep[parents[parents >= 0]]):
        raise AssertionError("pruning dropped an ancestor of a kept node; counts are not prefix counts")
    new_index = np.full(n, -1, dtype=np.int64)
    new_index[kept] = np.arange(kept.size)
    new_parents = np.where(parents >= 0, new_index[np.maximum(parents, 0)], -1)
    return Trie(trie.tokens[kept], new_parents, trie.depth[kept], trie.count[kept])
