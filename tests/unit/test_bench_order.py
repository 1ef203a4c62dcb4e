"""The benchmark's method order: within a question each method runs first equally often
(rotated per repeat), so an effect of running second in a pair cancels out of every category."""

from draftwise.bench.runner import method_order


def test_each_method_runs_first_equally_often_within_a_question():
    names = ["plain", "auto"]
    for question in range(3):
        orders = [method_order(names, question, repeat) for repeat in range(4)]
        assert sorted(order[0] for order in orders) == ["auto", "auto", "plain", "plain"]
        assert all(sorted(order) == sorted(names) for order in orders)
        assert orders[0] != orders[1]  # consecutive repeats swap the pair
    assert [method_order(["a", "b", "c"], 0, r) for r in range(3)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert method_order(["a", "b", "c"], 1, 0) == ["b", "c", "a"]  # and the next question starts one further on
    assert method_order([], 0, 0) == []
