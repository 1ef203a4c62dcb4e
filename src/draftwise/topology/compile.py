"""Compile typed proposals into one candidate graph the target verifies in a single pass.

Paths are merged by their FULL token prefix (a trie keyed by (parent row, token)), never by
(depth, token): two equal tokens under different prefixes are different rows with their own
masks and KV rows.  Rows come in parent-before-child order.

Coordinates (docs/architecture.md, "Coordinates"): with `prefix_len` committed tokens, the last of them being the
pending token at position prefix_len - 1, candidate row r sits at position
prefix_len + depth[r] - 1.  The target logits come back as row 0 = frontier (the pending
token's output) and row r + 1 = the output of candidate row r, so the distribution that
scores token_ids[r] is logits row parent[r] + 1 (a row's own logits predict its children).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, ProposalResult
from draftwise.errors import ContractError, InputError

COMPILER_VERSION = "2"  # 2: the node budget counts nodes, merged ones included (1 counted rows)


class GraphError(ContractError):
    """A compiled candidate graph breaks one of its invariants."""


@dataclass(frozen=True)
class TreeLimits:
    max_nodes: int = 64
    max_depth: int = 16

    def __post_init__(self) -> None:
        for name in ("max_nodes", "max_depth"):
            if getattr(self, name) < 0:  # 0 is a round without drafts; below that is a typo
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, eq=False)
class CompiledRound:
    prefix_len: int
    token_ids: np.ndarray  # [N] int64
    parent: np.ndarray  # [N] int64, -1 = child of the frontier
    depth: np.ndarray  # [N] int64, >= 1
    position_ids: np.ndarray  # [N] int64, prefix_len + depth - 1
    ancestor_mask: np.ndarray  # [N, N] bool, self and ancestors
    source_id: np.ndarray  # [N] int64, index into `sources` of the first result that proposed the row
    sources: tuple[str, ...]
    q: np.ndarray  # [N] float64, proposal probability; NaN where the source has none
    score: np.ndarray  # [N] float64, frequency or score; NaN where the source has none
    # origin[k][i] = row of node i of results[k]: which full prefix every input node landed on
    origin: tuple[tuple[int, ...], ...]
    # q_dist[k][parent_row] = proposal distribution [V] of results[k] at that parent (normalized only)
    q_dist: tuple[dict[int, np.ndarray], ...] = field(default_factory=tuple)
    children: tuple[tuple[int, ...], ...] = ()  # children[parent_row + 1] = child rows, sibling order

    @property
    def n(self) -> int:
        return int(self.token_ids.shape[0])

    def children_of(self, row: int) -> tuple[int, ...]:
        """Child rows of `row` (-1 = the frontier), in the order they were proposed."""
        return self.children[row + 1]

    def path_tokens(self, row: int) -> tuple[int, ...]:
        tokens: list[int] = []
        while row != -1:
            tokens.append(int(self.token_ids[row]))
            row = int(self.parent[row])
        return tuple(reversed(tokens))

    def leaves(self) -> list[int]:
        return [r for r in range(self.n) if not self.children_of(r)]


def compile_round(prefix_len: int, results: list[ProposalResult], limits: TreeLimits = TreeLimits()) -> CompiledRound:
    """Merge results by full prefix into rows; nodes beyond the limits are dropped with their subtrees.

    The node budget counts nodes, not rows: a node that merges into an existing row still
    takes its place (so rows <= max_nodes).  Which nodes survive then depends on their
    positions alone, never on the drawn tokens.  Counting rows would keep a later i.i.d. draw
    only when it repeats an earlier one, so the draws a residual verifier tests would be
    chosen by their values, and the number of draws SpecTr's k-sequential selection sees
    would depend on them: both bias the output.
    """
    row_of_key: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    source_ids: list[int] = []
    qs: list[float] = []
    scores: list[float] = []
    origin: list[tuple[int, ...]] = []
    q_dist: list[dict[int, np.ndarray]] = []
    kept = 0  # nodes kept so far, merged ones included: the budget is positional
    for k, result in enumerate(results):
        rows_of_nodes: list[int] = []
        for node in result.nodes:
            parent_row = -1 if node.parent == -1 else rows_of_nodes[node.parent]
            if parent_row == -2 or node.depth > limits.max_depth or kept >= limits.max_nodes:
                rows_of_nodes.append(-2)  # dropped with its subtree
                continue
            kept += 1
            key = (parent_row, node.token)
            row = row_of_key.get(key)
            if row is None:
                row = len(tokens)
                row_of_key[key] = row
                tokens.append(node.token)
                parents.append(parent_row)
                depths.append(node.depth)
                source_ids.append(k)
                qs.append(np.nan if node.q is None else node.q)
                scores.append(np.nan if node.score is None else node.score)
            rows_of_nodes.append(row)
        origin.append(tuple(rows_of_nodes))
        if result.semantics is ProbabilitySemantics.NORMALIZED_CONDITIONAL:
            q_dist.append({(-1 if p == -1 else rows_of_nodes[p]): d for p, d in result.distributions.items()
                           if p == -1 or rows_of_nodes[p] >= 0})
        else:
            q_dist.append({})
    return _assemble(prefix_len, tokens, parents, depths, source_ids, qs, scores, origin, q_dist,
                     tuple(r.source for r in results))


def cut_to_depth(round_: CompiledRound, depth: int) -> CompiledRound:
    """`round_` without its rows deeper than `depth`: exactly the rows it held at depth <= d,
    in the same order (rows are parent-before-child, so the kept ones still are)."""
    return keep_rows(round_, round_.depth <= depth)


def keep_rows(round_: CompiledRound, keep_mask: np.ndarray) -> CompiledRound:
    """`round_` with only the rows of `keep_mask` [N] bool, which must hold every kept row's
    parent (a depth cut; a source's own rows), in the same order."""
    keep = np.flatnonzero(keep_mask)  # [K] old row ids, ascending
    parents = round_.parent[keep]
    if np.any((parents >= 0) & ~keep_mask[np.maximum(parents, 0)]):
        raise ValueError("a kept row's parent was cut: the rows kept must be closed under ancestors")
    new_of = np.full(round_.n + 1, -2, dtype=np.int64)  # old row + 1 -> new row (-2: cut); the frontier stays -1
    new_of[0] = -1
    new_of[keep + 1] = np.arange(keep.size)
    origin = tuple(tuple(int(new_of[row + 1]) if row >= 0 else row for row in rows) for rows in round_.origin)
    q_dist = tuple({int(new_of[p + 1]): d for p, d in dists.items() if new_of[p + 1] != -2} for dists in round_.q_dist)
    return _assemble(round_.prefix_len, round_.token_ids[keep].tolist(), new_of[round_.parent[keep] + 1].tolist(),
                     round_.depth[keep].tolist(), round_.source_id[keep].tolist(), round_.q[keep].tolist(),
                     round_.score[keep].tolist(), list(origin), list(q_dist), round_.sources)


def _assemble(prefix_len: int, tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int],
              source_ids: Sequence[int], qs: Sequence[float], scores: Sequence[float],
              origin: Sequence[tuple[int, ...]], q_dist: Sequence[dict[int, np.ndarray]],
              sources: Sequence[str]) -> CompiledRound:
    n = len(tokens)
    parent = np.asarray(parents, dtype=np.int64).reshape(n)
    depth = np.asarray(depths, dtype=np.int64).reshape(n)
    mask = np.zeros((n, n), dtype=bool)
    for r in range(n):
        mask[r, r] = True
        if parent[r] >= 0:
            mask[r] |= mask[parent[r]]  # parent rows come first, so their ancestry is complete
    child_lists: list[list[int]] = [[] for _ in range(n + 1)]
    for r in range(n):
        child_lists[parent[r] + 1].append(r)
    return CompiledRound(
        prefix_len=prefix_len,
        token_ids=np.asarray(tokens, dtype=np.int64).reshape(n),
        parent=parent,
        depth=depth,
        position_ids=prefix_len + depth - 1,
        ancestor_mask=mask,
        source_id=np.asarray(source_ids, dtype=np.int64).reshape(n),
        sources=tuple(sources),
        q=np.asarray(qs, dtype=np.float64).reshape(n),
        score=np.asarray(scores, dtype=np.float64).reshape(n),
        origin=tuple(origin),
        q_dist=tuple(q_dist),
        children=tuple(tuple(c) for c in child_lists),
    )


def empty_round(prefix_len: int) -> CompiledRound:
    return compile_round(prefix_len, [])


def validate_candidate_graph(round_: CompiledRound, results: list[ProposalResult] | None = None) -> None:
    """Raise GraphError on any broken invariant; with `results`, also check every input
    node landed on a row with exactly its own full prefix (catches (depth, token) merging)."""
    n = round_.n
    for name in ("token_ids", "parent", "depth", "position_ids", "source_id", "q", "score"):
        if getattr(round_, name).shape != (n,):
            raise GraphError(f"{name} has shape {getattr(round_, name).shape}, expected ({n},)")
    if round_.ancestor_mask.shape != (n, n):
        raise GraphError(f"ancestor_mask has shape {round_.ancestor_mask.shape}, expected ({n}, {n})")
    for r in range(n):
        p = int(round_.parent[r])
        if not -1 <= p < r:
            raise GraphError(f"row {r} comes before its parent {p} (rows must be parent-before-child)")
        want_depth = 1 if p == -1 else int(round_.depth[p]) + 1
        if round_.depth[r] != want_depth:
            raise GraphError(f"row {r} has depth {round_.depth[r]}, its parent implies {want_depth}")
        if round_.position_ids[r] != round_.prefix_len + round_.depth[r] - 1:
            raise GraphError(
                f"row {r} sits at position {round_.position_ids[r]}, expected prefix_len + depth - 1 = "
                f"{round_.prefix_len + round_.depth[r] - 1}"
            )
        want_mask = np.zeros(n, dtype=bool)
        a = r
        while a != -1:
            want_mask[a] = True
            a = int(round_.parent[a])
        if not np.array_equal(round_.ancestor_mask[r], want_mask):
            bad = np.flatnonzero(round_.ancestor_mask[r] != want_mask).tolist()
            raise GraphError(f"row {r} mask is wrong at columns {bad}: it must see exactly itself and its ancestors")
    seen: dict[tuple[int, int], int] = {}
    for r in range(n):
        key = (int(round_.parent[r]), int(round_.token_ids[r]))
        if key in seen:
            raise GraphError(f"rows {seen[key]} and {r} are the same full prefix and were not merged")
        seen[key] = r
    if results is not None:
        for k, result in enumerate(results):
            for i, row in enumerate(round_.origin[k]):
                if row >= 0 and round_.path_tokens(row) != result.path(i):
                    raise GraphError(
                        f"node {i} of {result.source!r} has prefix {result.path(i)} but landed on row {row} "
                        f"with prefix {round_.path_tokens(row)}: different full prefixes were merged"
                    )
