"""Sequoia's dynamic program: the tree of n nodes and depth <= d that maximizes G.

Conventions (the ones under which the hand-worked toy in `oracles/hardware_tree.py` comes out exactly):
- A tree includes its root, the pending token (depth 0).  "n nodes" counts the root, so a
  tree of n nodes verifies n rows and proposes n - 1 candidates.  Depth counts edges: a
  chain root -> c1 -> c2 has depth 2 and needs 2 draft steps.
- A candidate is addressed by its path of child-slot indices from the root (Medusa / vLLM
  format): (0,) is the root's first slot, (1,) its second, (0, 0) the first child of (0,).
  Slot j of a node is the j-th sibling drawn (without replacement, for Sequoia).
- p[k][j] (positional acceptance, see `acceptance.py`) is the probability that slot j is
  the selected child of a reached node whose children sit at depth k+1.  A vector p means
  every depth shares it; depths deeper than the last row reuse the last row.
- G(tree) = sum over nodes v of f(v), with f(root) = 1 and f(v) = product of p along the
  path to v.  f(v) is the probability that v is accepted, so G = E[accepted candidates] + 1
  = the expected number of tokens committed per round (accepted + the bonus token).
  Because each row of p sums to <= 1, 1 <= G <= min(n, d + 1).

Recurrence (Sequoia, Chen et al. 2024, Sec. 3.1 / App.), for a subtree rooted at absolute
depth a under a global depth bound D, with B(n, a) its best value and E(n, a, b) the best
value when the subtree root has exactly b children (slots 0..b-1):
  root-only base case : E(1, a, 0) = 1; E(n > 1, a, 0) = -inf; and B(n, D) = 1 iff n == 1.
  one-child           : E(n, a, 1) = 1 + p[a][0] * B(n - 1, a + 1)
  split (b >= 2)      : E(n, a, b) = max_{m=1..n-2} E(n - m, a, b - 1) + p[a][b-1] * B(m, a + 1)
                        (left: the root with its first b-1 children, n - m nodes; right:
                        the subtree under the last slot, m nodes; appending the *last* slot
                        leaves every other slot's index, hence its p, unchanged)
  best                : B(n, a) = max_b E(n, a, b);  T[n, d] = B(n, 0) under D = d.
The one-child case is the split with the root-only left part, so one loop covers both.
"Exactly b children" rather than "at most b" keeps the DP exact when measured p is not
monotone (noise can make p_3 > p_2); with monotone p both give the same T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.optimize.acceptance import as_depth_matrix, row_for_depth

Path = tuple[int, ...]
Paths = tuple[Path, ...]
BOUND_SLACK = 1e-9  # float slack for the 1 <= G <= min(n, d + 1) sanity bound
BRUTE_FORCE_MAX_NODES = 9  # ordered trees grow as Catalan numbers; 9 nodes is 1430 trees


# ----------------------------------------------------------------------------- paths


def validate_paths(paths: Sequence[Sequence[int]]) -> Paths:
    """Check a Medusa/vLLM path list; return it as a tuple of tuples.

    Refused: a repeated path, a path whose parent is missing or listed after it, and a slot
    j > 0 whose sibling slot j - 1 is absent (slot j is the j-th draw; it needs j - 1).
    """
    result = tuple(tuple(int(s) for s in path) for path in paths)
    seen: set[Path] = set()
    for path in result:
        if not path or any(s < 0 for s in path):
            raise InputError(f"path {path} must be a non-empty tuple of non-negative slot indices")
        if path in seen:
            raise InputError(f"path {path} is listed twice")
        if len(path) > 1 and path[:-1] not in seen:
            raise InputError(f"path {path} comes before (or without) its parent {path[:-1]}")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in seen:
            raise InputError(f"path {path} has no earlier sibling slot {path[-1] - 1} before it")
        seen.add(path)
    return result


def tree_depth(paths: Sequence[Sequence[int]]) -> int:
    return max((len(path) for path in paths), default=0)


def expected_tokens(p: Sequence[float] | Sequence[Sequence[float]] | np.ndarray,
                    paths: Sequence[Sequence[int]]) -> float:
    """G of an explicit tree: 1 (root / bonus) + sum over candidates of their path's product of p."""
    matrix = as_depth_matrix(p)  # [D, W]
    width = matrix.shape[1]
    total = 1.0
    for path in validate_paths(paths):
        if max(path) >= width:
            raise InputError(f"path {path} uses a slot beyond the calibrated width {width}")
        prob = 1.0
        for depth, slot in enumerate(path, start=1):
            prob *= float(row_for_depth(matrix, depth)[slot])
        total += prob
    return total


def check_bound(value: float, n: int, d: int) -> None:
    """Raise AssertionError unless 1 <= G <= min(n, d + 1): a broken DP or an unvalidated p."""
    if not 1.0 - BOUND_SLACK <= value <= min(n, d + 1) + BOUND_SLACK:
        raise AssertionError(f"G = {value!r} breaks 1 <= G <= min(n={n}, d+1={d + 1})")


# ----------------------------------------------------------------------------- the DP


@dataclass(frozen=True)
class _DepthBoundTables:
    """Backpointers of one depth bound D; index a is the absolute depth of a subtree root."""

    best: np.ndarray  # [D+1, N+1] B(n, a); -inf where no tree fits
    branch: np.ndarray  # [D+1, N+1] argmax b of B(n, a)
    split: np.ndarray  # [D+1, W+1, N+1] m = nodes under the last slot of E(n, a, b)


def _max_plus(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """out[n] = max_{m >= 1} left[n - m] + right[m], with its argmax m.  Both [N+1], -inf = none."""
    size = left.shape[0]
    n_idx = np.arange(size)[:, None]  # [N+1, 1]
    m_idx = np.arange(size)[None, :]  # [1, N+1]
    left_idx = n_idx - m_idx  # [N+1, N+1]
    valid = (m_idx >= 1) & (left_idx >= 1)
    combined = np.where(valid, left[np.clip(left_idx, 0, None)] + right[None, :], -np.inf)  # [N+1, N+1]
    arg = np.argmax(combined, axis=1)  # first maximum: the smallest last subtree on ties
    return combined[np.arange(size), arg], arg


def _solve_depth_bound(matrix: np.ndarray, n_max: int, bound: int) -> _DepthBoundTables:
    """All B(n, a) for depth bound D = `bound`, filled from the deepest level up."""
    width = matrix.shape[1]
    best = np.full((bound + 1, n_max + 1), -np.inf)  # [D+1, N+1]
    branch = np.zeros((bound + 1, n_max + 1), dtype=np.int64)
    split = np.zeros((bound + 1, width + 1, n_max + 1), dtype=np.int64)
    best[bound, 1] = 1.0  # root-only base case: nodes at depth D cannot have children
    for a in range(bound - 1, -1, -1):
        slots = row_for_depth(matrix, a + 1)  # [W] p of the children of a depth-a node
        exact = np.full(n_max + 1, -np.inf)
        exact[1] = 1.0  # E(n, a, 0): the root alone
        best[a] = exact
        present = np.isfinite(best[a + 1])  # [N+1] sizes that fit below depth a
        below = np.where(present, best[a + 1], 0.0)  # 0 * -inf is nan in IEEE: mask first
        for b in range(1, min(width, n_max - 1) + 1):
            right = np.where(present, slots[b - 1] * below, -np.inf)  # absent stays -inf
            exact, split[a, b] = _max_plus(exact, right)
            better = exact > best[a]
            best[a] = np.where(better, exact, best[a])
            branch[a] = np.where(better, b, branch[a])
    for arr in (best, branch, split):
        arr.flags.writeable = False  # the table is shared by every reconstruction
    return _DepthBoundTables(best=best, branch=branch, split=split)


def _subtree(tables: _DepthBoundTables, n: int, a: int, prefix: Path) -> list[Path]:
    """Paths of the optimal n-node subtree rooted at `prefix` (absolute depth a), root excluded."""
    paths: list[Path] = []
    b = int(tables.branch[a, n])
    remaining = n
    while b > 0:  # peel slots from the last one down: left keeps n - m nodes
        m = int(tables.split[a, b, remaining])
        child = prefix + (b - 1,)
        paths.append(child)
        paths.extend(_subtree(tables, m, a + 1, child))
        remaining -= m
        b -= 1
    return paths


def canonical_order(paths: Sequence[Path]) -> Paths:
    """Breadth-first (by depth, then slots): parent before child, the order Medusa uses."""
    return tuple(sorted(paths, key=lambda path: (len(path), path)))


@dataclass(frozen=True, eq=False)
class SequoiaTable:
    """T[n, d] for 0 <= n <= n_max, 0 <= d <= d_max (n = 0 is never feasible), and the trees."""

    p: np.ndarray  # [D, W] positional acceptance used
    values: np.ndarray  # [N+1, d_max+1] max G; -inf where no tree of n nodes and depth <= d fits
    tables: tuple[_DepthBoundTables, ...]  # one per depth bound d = 0..d_max

    @property
    def n_max(self) -> int:
        return self.values.shape[0] - 1

    @property
    def d_max(self) -> int:
        return self.values.shape[1] - 1

    def feasible(self, n: int, d: int) -> bool:
        return bool(np.isfinite(self.values[n, d]))

    def value(self, n: int, d: int) -> float:
        return float(self.values[n, d])

    def paths(self, n: int, d: int) -> Paths:
        """The optimal tree (root excluded) as Medusa/vLLM paths in breadth-first order."""
        if not self.feasible(n, d):
            raise InputError(f"no tree of {n} nodes and depth <= {d} fits slot width {self.p.shape[1]}")
        return canonical_order(_subtree(self.tables[d], n, 0, ()))


def solve(p: Sequence[float] | Sequence[Sequence[float]] | np.ndarray, n_max: int, d_max: int) -> SequoiaTable:
    """Run the DP for every n <= n_max and depth bound d <= d_max."""
    if n_max < 1 or d_max < 0:
        raise InputError(f"need n_max >= 1 and d_max >= 0, got {n_max}, {d_max}")
    matrix = as_depth_matrix(p).copy()  # [D, W]
    matrix.flags.writeable = False
    # Each depth bound is solved on its own: with depth-indexed p a subtree's value depends
    # on its absolute depth, so tables for bound d cannot be shifted copies of bound d + 1.
    tables = tuple(_solve_depth_bound(matrix, n_max, d) for d in range(d_max + 1))
    values = np.stack([t.best[0] for t in tables], axis=1)  # [N+1, d_max+1]
    for n, d in zip(*np.nonzero(np.isfinite(values))):
        check_bound(float(values[n, d]), int(n), int(d))
    values.flags.writeable = False
    return SequoiaTable(p=matrix, values=values, tables=tables)


# ----------------------------------------------------------------------------- brute force


def _ordered_forests(size: int) -> Iterator[tuple]:
    """Every ordered forest of `size` nodes; a tree is the tuple of its children's trees."""
    if size == 0:
        yield ()
        return
    for first in range(1, size + 1):
        for children in _ordered_forests(first - 1):
            for rest in _ordered_forests(size - first):
                yield (children,) + rest


def _forest_paths(forest: tuple, prefix: Path) -> list[Path]:
    paths: list[Path] = []
    for slot, children in enumerate(forest):
        child = prefix + (slot,)
        paths.append(child)
        paths.extend(_forest_paths(children, child))
    return paths


def enumerate_trees(n: int) -> Iterator[Paths]:
    """All ordered trees of n nodes (root included), as breadth-first path tuples."""
    if not 1 <= n <= BRUTE_FORCE_MAX_NODES:
        raise InputError(f"brute force enumerates 1..{BRUTE_FORCE_MAX_NODES} nodes, got {n}")
    for forest in _ordered_forests(n - 1):
        yield canonical_order(_forest_paths(forest, ()))


def brute_force(p: Sequence[float] | Sequence[Sequence[float]] | np.ndarray, n: int, d: int) -> tuple[float, Paths | None]:
    """Best G over every ordered tree of n nodes, depth <= d, slots < W; (-inf, None) if none fits."""
    width = as_depth_matrix(p).shape[1]
    best_value, best_paths = -np.inf, None
    for paths in enumerate_trees(n):
        if tree_depth(paths) > d or any(path[-1] >= width for path in paths):
            continue
        value = expected_tokens(p, paths)
        if value > best_value:
            best_value, best_paths = value, paths
    return best_value, best_paths
