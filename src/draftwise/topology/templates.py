"""Static tree templates in the Medusa/vLLM path format.

A template is a tuple of paths; a path is a tuple of child-slot indices from the frontier, so
((0,), (1,), (0, 0)) means: two children of the frontier, and one child under the first.
Slot i under a parent is the parent's i-th draft (its i-th sample, or i-th best for top-k).

Invariants (checked by `from_paths`): paths are non-empty tuples of non-negative ints, every
proper prefix of a path is present, and the slots under each parent are 0..n-1 with no gap.
The last rule is there for exactness: under without-replacement sampling slot i is drawn
after slots 0..i-1 were removed, so a kept slot 2 with a missing slot 1 would hide a removal
from the verifier.  Canonical order is parent-before-child: by depth, then lexicographic.
"""

from __future__ import annotations

import itertools
import json
from typing import Iterable, NamedTuple, Sequence

from draftwise.errors import InputError

Path = tuple[int, ...]
Template = tuple[Path, ...]


class Slot(NamedTuple):
    parent: int  # index of the parent node in the template (-1 = the frontier)
    slot: int  # which of the parent's drafts this node is


def from_paths(paths: Iterable[Sequence[int]]) -> Template:
    """Validate, deduplicate and sort paths parent-before-child; ValueError on a broken template."""
    unique: set[Path] = set()
    for raw in paths:
        path = tuple(raw)
        if not path:
            raise InputError("a template path must be non-empty: the frontier itself is not a node")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in path):
            raise InputError(f"template path {path} must hold non-negative integer slot indices")
        unique.add(path)
    for path in unique:
        if len(path) > 1 and path[:-1] not in unique:
            raise InputError(f"template path {path} lacks its prefix {path[:-1]}: every prefix must be present")
    slots: dict[Path, list[int]] = {}
    for path in unique:
        slots.setdefault(path[:-1], []).append(path[-1])
    for parent, taken in slots.items():
        if sorted(taken) != list(range(len(taken))):
            where = "the frontier" if not parent else f"path {parent}"
            raise InputError(
                f"slots under {where} are {sorted(taken)}; they must be 0..{len(taken) - 1} with no gap "
                "(a missing draft would hide a without-replacement removal from the verifier)"
            )
    return tuple(sorted(unique, key=lambda p: (len(p), p)))


def chain(k: int) -> Template:
    """One draft per level, k levels."""
    if k < 1:
        raise InputError(f"a chain needs k >= 1, got {k}")
    return tuple((0,) * d for d in range(1, k + 1))


def comb(width: int, depth: int) -> Template:
    """`width` children at every level, only the first of which has children: (0..W-1),
    (0, 0..W-1), ... down to `depth` (width * depth nodes)."""
    if width < 1 or depth < 1:
        raise InputError(f"a comb needs width and depth >= 1, got {width} and {depth}")
    return from_paths((0,) * level + (slot,) for level in range(depth) for slot in range(width))


def cartesian(branching: Sequence[int]) -> Template:
    """Full tree: every node at depth d has branching[d] children (depth 0 = the frontier);
    [3, 2, 2] -> 3 + 6 + 12 = 21 nodes."""
    widths = _positive(branching, "branching")
    paths = [p for d in range(1, len(widths) + 1) for p in itertools.product(*(range(w) for w in widths[:d]))]
    return from_paths(paths)


def width_by_depth(widths: Sequence[int]) -> Template:
    """Every node at depth d has widths[d] children (depth 0 = the frontier).  As specified this
    is the same tree as `cartesian`; it exists as the 'wbd:' spelling of tree specs."""
    return cartesian(_positive(widths, "widths"))


def slots_by_parent(template: Template) -> tuple[Slot, ...]:
    """For each node of the (canonical) template, its parent's node index and its slot; parents
    come first, so a proposer can expand the tree in this order."""
    canonical = from_paths(template)
    index = {path: i for i, path in enumerate(canonical)}
    return tuple(Slot(-1 if len(p) == 1 else index[p[:-1]], p[-1]) for p in canonical)


def num_children(template: Template) -> dict[int, int]:
    """Drafts needed under each parent (-1 = frontier), keyed by node index of the canonical template."""
    counts: dict[int, int] = {}
    for slot in slots_by_parent(template):
        counts[slot.parent] = counts.get(slot.parent, 0) + 1
    return counts


def max_depth(template: Template) -> int:
    return max((len(p) for p in template), default=0)


MAX_TEMPLATE_NODES = 4096  # a user's template beyond this is a typo, not a tree anyone can verify


def parse_template(spec: str) -> Template:
    """'chain:4', 'cartesian:3,2,2', 'wbd:2,2,1', or a JSON list of paths such as '[[0],[1],[0,0]]'.
    User input is held to more than `from_paths` asks: no empty tree, no repeated path, and at
    most MAX_TEMPLATE_NODES nodes."""
    template = _parse(spec)
    if not template:
        raise InputError(f"tree template {spec!r} has no node: it would draft nothing every round")
    if len(template) > MAX_TEMPLATE_NODES:
        raise InputError(f"tree template {spec!r} has {len(template)} nodes, more than {MAX_TEMPLATE_NODES}")
    return template


def _parse(spec: str) -> Template:
    text = spec.strip()
    if text.startswith("["):
        try:
            paths = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:  # RecursionError: brackets nested too deep
            raise InputError(f"tree template {spec!r} is not valid JSON: {err}") from err
        if not isinstance(paths, list) or not all(isinstance(p, list) for p in paths):
            raise InputError(f"tree template {spec!r} must be a JSON list of paths (lists of slot indices)")
        _check_size(spec, len(paths))
        try:
            template = from_paths(paths)  # checks every slot is an integer before paths are compared
        except InputError as err:
            raise InputError(f"tree template {spec!r}: {err}") from None
        if len(template) != len(paths):
            raise InputError(f"tree template {spec!r} lists a path twice (each node is one draft)")
        return template
    kind, sep, args = text.partition(":")
    if not sep:
        raise InputError(f"tree template {spec!r}: expected 'chain:K', 'cartesian:B1,B2,..', 'wbd:W1,W2,..' or JSON")
    if kind not in ("chain", "cartesian", "wbd"):
        raise InputError(f"tree template {spec!r}: unknown kind {kind!r} (chain, cartesian, wbd, or JSON)")
    try:
        numbers = [int(a) for a in args.split(",")]
    except ValueError as err:
        raise InputError(f"tree template {spec!r}: {args!r} is not a comma-separated list of integers") from err
    if kind == "chain":
        if len(numbers) != 1:
            raise InputError(f"tree template {spec!r}: chain takes one length")
        if numbers[0] < 1:
            raise InputError(f"tree template {spec!r}: a chain needs a length >= 1, got {numbers[0]}")
        _check_size(spec, numbers[0])
        return chain(numbers[0])
    if not numbers or any(n < 1 for n in numbers):
        raise InputError(f"tree template {spec!r}: {kind} takes positive integers, got {numbers}")
    _check_size(spec, _full_tree_nodes(numbers))
    if kind == "cartesian":
        return cartesian(numbers)
    return width_by_depth(numbers)


def _check_size(spec: str, nodes: int) -> None:
    """Refused before the tree is built: 'chain:10**9' must not take the memory first."""
    if nodes > MAX_TEMPLATE_NODES:
        raise InputError(f"tree template {spec!r} has more than {MAX_TEMPLATE_NODES} nodes")


def _full_tree_nodes(widths: Sequence[int]) -> int:
    """Nodes of the full tree with widths[d] children per node at depth d (counted up to just past the cap)."""
    total, level = 0, 1
    for width in widths:
        level *= width
        total += level
        if total > MAX_TEMPLATE_NODES:
            break
    return total


def _positive(values: Sequence[int], what: str) -> list[int]:
    out = [int(v) for v in values]
    if not out or any(v < 1 for v in out):
        raise InputError(f"{what} must be a non-empty list of positive integers, got {list(values)}")
    return out
