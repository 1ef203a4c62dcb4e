"""Tree templates: constructors, validation, canonical order, parent/slot expansion, parsing."""

from __future__ import annotations

import pytest

from draftwise.topology.templates import (
    Slot,
    cartesian,
    chain,
    from_paths,
    max_depth,
    num_children,
    parse_template,
    slots_by_parent,
    width_by_depth,
)


def test_chain():
    assert chain(3) == ((0,), (0, 0), (0, 0, 0))
    with pytest.raises(ValueError):
        chain(0)


def test_cartesian_counts_and_order():
    t = cartesian([3, 2, 2])
    assert len(t) == 21
    assert [sum(len(p) == d for p in t) for d in (1, 2, 3)] == [3, 6, 12]
    assert t[:4] == ((0,), (1,), (2,), (0, 0))
    assert all(len(a) < len(b) or (len(a) == len(b) and a < b) for a, b in zip(t, t[1:]))
    with pytest.raises(ValueError, match="positive"):
        cartesian([2, 0])


def test_width_by_depth_gives_every_node_the_width_of_its_depth():
    t = width_by_depth([2, 2, 1])
    assert len(t) == 2 + 4 + 4
    counts = num_children(t)
    for i, path in enumerate(t):
        want = {1: 2, 2: 1, 3: 0}[len(path)]
        assert counts.get(i, 0) == want
    assert counts[-1] == 2


def test_from_paths_sorts_and_deduplicates():
    t = from_paths([[0, 1], (1,), (0,), (0, 0), (0, 1), [0]])
    assert t == ((0,), (1,), (0, 0), (0, 1))


@pytest.mark.parametrize(
    "paths, message",
    [
        ([(0,), (0, 0, 0)], "lacks its prefix"),
        ([(0, 0)], "lacks its prefix"),
        ([(0,), (2,)], "no gap"),
        ([(0,), (0, 1)], "no gap"),
        ([()], "non-empty"),
        ([(0,), (-1,)], "non-negative"),
        ([(0.0,)], "non-negative integer"),
    ],
)
def test_from_paths_rejects_broken_templates(paths, message):
    with pytest.raises(ValueError, match=message):
        from_paths(paths)


def test_slots_by_parent_expands_parents_first():
    t = from_paths([(1, 0), (0,), (1,), (0, 1), (0, 0)])
    assert t == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    slots = slots_by_parent(t)
    assert slots == (Slot(-1, 0), Slot(-1, 1), Slot(0, 0), Slot(0, 1), Slot(1, 0))
    assert all(s.parent < i for i, s in enumerate(slots))
    assert num_children(t) == {-1: 2, 0: 2, 1: 1}
    assert max_depth(t) == 2


def test_parse_template():
    assert parse_template("chain:4") == chain(4)
    assert parse_template("cartesian:3,2,2") == cartesian([3, 2, 2])
    assert parse_template(" wbd:2,2,1 ") == width_by_depth([2, 2, 1])
    assert parse_template("[[0],[1],[0,0]]") == ((0,), (1,), (0, 0))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tree:2", "unknown kind"),
        ("chain", "expected"),
        ("chain:a", "integers"),
        ("chain:2,3", "one length"),
        ("[[0], [", "not valid JSON"),
        ('{"a": 1}', "unknown kind"),
        ("[0, 1]", "JSON list of paths"),
        ("[[1]]", "no gap"),
        ("[]", "no node"),
        ("[[0],[0]]", "a path twice"),
        ("cartesian:64,64,64", "more than 4096"),
    ],
)
def test_parse_template_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_template(spec)
