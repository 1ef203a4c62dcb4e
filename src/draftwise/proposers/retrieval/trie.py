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

from draftwise.errors import InputError

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

    Vectorized over the whole [K, L] block: after sorting the rows, a cell starts a new node
    exactly when its prefix differs from the row above, so node ids, parents and prefix
    counts come from a few array passes; one lexsort on each node's path of
    (-count, token) pairs then gives the canonical breadth-first order.  A per-cell dict walk
    was the slow part of a query on the largest tries; array passes keep it a small share of one
    (query latency: benchmarks/rest_index/).
    """
    k, length = continuations.shape
    if k == 0 or length == 0:
        return empty_trie()
    rows = continuations[np.lexsort(continuations.T[::-1])]  # [K, L] equal prefixes now adjacent
    alive = rows != PAD  # [K, L]
    same = np.zeros((k, length), dtype=bool)  # prefix through column d equals the row above's
    same[1:] = np.logical_and.accumulate(rows[1:] == rows[:-1], axis=1)
    new = alive & ~same  # [K, L] cells that open a node
    n = int(new.sum())
    if n == 0:
        return empty_trie()
    opened = np.where(new, np.cumsum(new.ravel()).reshape(k, length) - 1, -1)  # ids in row-major order
    node = np.maximum.accumulate(opened, axis=0)  # [K, L] node of every alive cell (ids grow downwards)
    count = np.bincount(node[alive], minlength=n)  # [N] prefix counts
    cell_row, cell_col = np.nonzero(new)  # [N] each node's opening cell, in id order
    parent = np.where(cell_col == 0, -1, node[cell_row, np.maximum(cell_col - 1, 0)])
    # canonical order = sort by depth, then by the path's (-count, token) pairs, root side first
    within = np.arange(length)[None, :] <= cell_col[:, None]  # [N, L] columns on the node's path
    path_counts = np.where(within, -count[np.maximum(node[cell_row], 0)], 0)  # [N, L]
    path_tokens = np.where(within, rows[cell_row], 0)  # [N, L]
    keys = [column for d in range(length - 1, -1, -1) for column in (path_tokens[:, d], path_counts[:, d])]
    order = np.lexsort(keys + [cell_col])  # np.lexsort: last key is the primary one
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    parent = parent[order]
    return Trie(
        rows[cell_row, cell_col][order].astype(np.int64),
        np.where(parent >= 0, rank[np.maximum(parent, 0)], -1),
        (cell_col + 1)[order].astype(np.int64),
        count[order].astype(COUNTER_DTYPE),
    )


def prune(trie: Trie, budget: int) -> Trie:
    """Keep at most `budget` nodes: the highest counts, ancestor-closed, in canonical order."""
    if budget < 0:
        raise InputError(f"node budget must be >= 0, got {budget}")
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
