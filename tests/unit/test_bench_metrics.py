"""Metrics against hand-built answers: Spec-Bench tok/s and speedup, pooled acceptance, time split,
latency, mismatch detection, median repeat, answer-line round trip."""

import pytest

from draftwise.bench.metrics import find_mismatches, first_difference, method_metrics
from draftwise.bench.outputs import TurnOutput
from draftwise.bench.runner import median_answer
from draftwise.bench.store import Answer, answer_line, parse_answer_line
from draftwise.workloads import Question


def turn(tokens, wall, rounds=None, phases=None, offsets=(), accept=None, kv=None):
    return TurnOutput(tokens=tuple(tokens), text="t", wall_time=wall, emit_offsets=tuple(offsets),
                      accept_lengths=None if accept is None else tuple(accept), rounds=rounds, phase_seconds=phases,
                      max_kv_bytes=kv)


def answer(qid, cat, *turns, method="m", error=None):
    return Answer(method, qid, cat, tuple(turns), tuple((t.wall_time,) for t in turns), error)


def test_first_difference():
    assert first_difference((1, 2, 3), (1, 2, 3)) is None
    assert first_difference((1, 2, 3), (1, 9, 3)) == 1
    assert first_difference((1, 2), (1, 2, 3)) == 2
    assert first_difference((), (5,)) == 0


def test_mismatches_report_turn_and_position():
    ref = {"a": answer("a", "x", turn([1, 2, 3], 1.0), turn([4, 5], 1.0)), "b": answer("b", "x", turn([7], 1.0))}
    mine = [answer("a", "x", turn([1, 2, 3], 1.0), turn([4, 6], 1.0)), answer("b", "x", turn([7], 1.0)),
            answer("c", "x", turn([1], 1.0))]  # no reference answer for c: not compared
    found, compared = find_mismatches(mine, ref)
    assert len(found) == 1 and compared == 3  # a's two turns and b's; c had nothing to compare with
    assert (found[0].question_id, found[0].turn, found[0].first_difference) == ("a", 1, 1)


def test_specbench_tokens_per_s_and_speedup():
    # per-question tok/s averaged (not total tokens / total time)
    ref = [answer("a", "x", turn(range(10), 1.0)), answer("b", "y", turn(range(10), 10.0))]  # 10 and 1 tok/s
    mine = [answer("a", "x", turn(range(10), 0.5)), answer("b", "y", turn(range(10), 5.0))]  # 20 and 2 tok/s
    ref_by_id = {a.question_id: a for a in ref}
    m = method_metrics(mine, ref_by_id, check_exact=True)
    assert m.tokens_per_s == pytest.approx(11.0)
    assert m.speedup == pytest.approx(11.0 / 5.5)
    assert m.speedup_per_prompt_median == pytest.approx(2.0)
    assert m.mismatches == 0
    assert m.ms_per_token == pytest.approx(5.5 / 20 * 1e3)
    r = method_metrics(ref, ref_by_id, check_exact=True, is_reference=True)
    assert r.speedup == 1.0 and r.mismatches == 0
    assert method_metrics(mine, None, check_exact=True).speedup is None
    assert method_metrics(mine, None, check_exact=True).mismatches is None
    assert method_metrics(mine, ref_by_id, check_exact=False).mismatches is None  # sampling: not compared


def test_multi_turn_question_counts_all_turns():
    a = answer("a", "x", turn(range(4), 1.0), turn(range(6), 1.0))
    assert a.new_tokens == 10 and a.tokens_per_s == pytest.approx(5.0)


def test_errors_are_counted_not_averaged():
    good = answer("a", "x", turn(range(10), 1.0))
    bad = Answer("m", "b", "x", (), (), error="ContextOverflow: too long")
    m = method_metrics([good, bad], None, check_exact=True)
    assert (m.questions, m.errors, m.tokens_per_s) == (1, 1, 10.0)


def test_pooled_rounds_acceptance_split_and_kv():
    # rounds: (nodes, depth, accepted, emitted, fallback)
    t1 = turn(range(7), 1.0, rounds=((3, 3, 3, 4, 0), (3, 3, 1, 2, 0), (0, 0, 0, 1, 1)),
              phases={"propose": 0.07, "compile": 0.0, "verify": 0.7, "select": 0.0, "commit": 0.07}, kv=100,
              offsets=(0.2, 0.5, 0.6), accept=(4, 2, 1))
    t2 = turn(range(3), 1.0, rounds=((2, 2, 2, 3, 0),),
              phases={"propose": 0.03, "compile": 0.0, "verify": 0.3, "select": 0.0, "commit": 0.03}, kv=300,
              offsets=(0.4,), accept=(3,))
    m = method_metrics([answer("a", "x", t1), answer("b", "x", t2)], None, check_exact=True)
    assert m.mean_accepted == pytest.approx(6 / 4)
    assert m.accepted_histogram == [1, 1, 1, 1]
    # depth 1: offered in 3 rounds (depth>=1, accepted>=0), accepted in 3; depth 3: offered in rounds with
    # depth>=3 and accepted>=2 -> only the first, accepted
    assert m.acceptance_by_depth == pytest.approx([1.0, 2 / 3, 1.0], abs=1e-4)
    # a depth offered only in rounds whose parent was rejected has no rate: None, not 0.0
    shallow = turn(range(2), 1.0, rounds=((3, 3, 0, 1, 0),), offsets=(0.5,), accept=(1,))
    assert method_metrics([answer("c", "x", shallow)], None, check_exact=True).acceptance_by_depth == [0.0, None, None]
    assert m.fallback_rate == pytest.approx(0.25)
    assert m.rows_verified_mean == pytest.approx((4 + 4 + 1 + 3) / 4)
    assert m.max_kv_bytes == 300
    assert m.max_provisional_kv_bytes is None  # bytes per KV row unknown
    with_rows = method_metrics([answer("a", "x", t1), answer("b", "x", t2)], None, check_exact=True, kv_row_bytes=10)
    assert with_rows.max_provisional_kv_bytes == (1 + 3) * 10  # the widest round: pending + 3 candidates
    assert m.time_split_ms["verify"] == pytest.approx(1.0 / 10 * 1e3)
    assert m.time_split_ms["other"] == pytest.approx((2.0 - 1.2) / 10 * 1e3)
    assert m.latency.p50_ms == pytest.approx(200.0)  # gaps 0.3, 0.1 (t1 only: t2 has one event)
    assert m.latency.ttft_median_ms == pytest.approx(300.0)


def test_a_reference_without_answers_leaves_mismatches_unchecked_not_zero():
    mine = [answer("a", "x", turn([1, 2], 1.0))]
    m = method_metrics(mine, {}, check_exact=True)  # the reference was skipped: no answers at all
    assert m.mismatches is None and m.compared_turns == 0
    errored = {"a": Answer("m", "a", "x", (), (), error="ContextOverflow: too long")}
    assert method_metrics(mine, errored, check_exact=True).mismatches is None
    ok = method_metrics(mine, {"a": answer("a", "x", turn([1, 2], 2.0))}, check_exact=True)
    assert ok.mismatches == 0 and ok.compared_turns == 1


def test_first_and_any_child_coverage_from_the_frontier_slots():
    # (nodes, depth, accepted, emitted, fallback, frontier children, slot taken)
    rounds = ((4, 1, 1, 2, 0, 4, 0), (4, 1, 1, 2, 0, 4, 2), (4, 1, 0, 1, 0, 4, -1), (0, 0, 0, 1, 1, 0, -1),
              (2, 2, 2, 3, 0, 1, 0))
    old = ((3, 3, 1, 2, 0),)  # written before the frontier was recorded: not counted
    m = method_metrics([answer("a", "x", turn(range(9), 1.0, rounds=rounds), turn(range(2), 1.0, rounds=old))],
                       None, check_exact=True)
    assert m.coverage_rounds == 4  # the fallback offered nothing
    assert m.first_child_coverage == pytest.approx(2 / 4) and m.any_child_coverage == pytest.approx(3 / 4)
    assert m.mean_accepted == pytest.approx(5 / 6, abs=1e-4)  # old and new rounds pool alike (rounded to 4 places)


def test_peer_accept_lengths_give_mean_accepted_without_rounds():
    t = turn(range(6), 1.0, accept=(3, 1, 2))
    m = method_metrics([answer("a", "x", t)], None, check_exact=True)
    assert m.mean_accepted == pytest.approx(1.0) and m.accepted_histogram == [1, 1, 1]
    assert m.acceptance_by_depth is None and m.time_split_ms is None
    unknown = method_metrics([answer("a", "x", turn(range(6), 1.0))], None, check_exact=True)
    assert unknown.mean_accepted is None


def test_median_repeat_is_one_real_run():
    q = Question("a", "x", ("one", "two"))
    # totals 4, 3, 5: the median repeat is the first, both its turns (not each turn's own median)
    runs = [[turn([1], 3.0), turn([2], 1.0)], [turn([1], 1.0), turn([2], 2.0)], [turn([1], 2.0), turn([2], 3.0)]]
    a = median_answer("m", q, runs)
    assert a.turns == tuple(runs[0])
    assert a.repeat_walls == ((3.0, 1.0, 2.0), (1.0, 2.0, 3.0))
    even = median_answer("m", Question("a", "x", ("one",)), [[turn([1], 4.0)], [turn([1], 1.0)]])
    assert even.turns[0].wall_time == 1.0  # lower median


def test_answer_line_is_specbench_shaped_and_round_trips():
    t = turn([5, 6, 7], 0.5, rounds=((2, 2, 1, 2, 0), (0, 0, 0, 1, 1)), phases={"verify": 0.1}, offsets=(0.1, 0.2),
             accept=(2, 1), kv=10)
    a = Answer("m", "q1", "cat", (t, t), ((0.5, 0.6), (0.5, 0.7)))
    row = answer_line(a, "model")
    choice = row["choices"][0]
    assert row["question_id"] == "q1" and row["category"] == "cat"
    assert choice["turns"] == ["t", "t"] and choice["new_tokens"] == [3, 3] and choice["wall_time"] == [0.5, 0.5]
    assert choice["accept_lengths"] == [2, 1, 2, 1]  # flat over turns, as Spec-Bench writes it
    assert parse_answer_line(row) == a


def test_the_summary_takes_each_familys_reference_from_the_methods_that_answered(tmp_path):
    """dw plain skipped (no answers): prompt lookup is measured and checked against the peer's
    plain generation instead of reporting no speedup and no exactness check."""
    from draftwise.bench.runner import BenchSettings
    from draftwise.bench.store import ResultStore
    from draftwise.bench.summary import build_summary

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count from one to ten.\n")
    settings = BenchSettings(workloads=(f"prompts:{prompts}",), target="smollm2-135m", max_new_tokens=8,
                             methods=("plain=dw:proposer=none,backend=transformers", "peer=hf-plain",
                                      "pl=dw:proposer=prompt-lookup,backend=transformers"))
    out = tmp_path / "run"
    store = ResultStore(out)
    store.open(settings.as_dict(), resume=False)
    for method, wall, tokens in (("peer", 2.0, [1, 2, 3]), ("pl", 1.0, [1, 2, 4])):
        store.append(answer("prompts-1", "prompts", turn(tokens, wall), method=method), "m")
    summary = build_summary(out)
    pl = summary["methods"]["pl"]
    assert pl["reference"] == "peer" and summary["methods"]["plain"]["reference"] is None
    assert pl["overall"]["speedup"] == pytest.approx(2.0)
    assert pl["overall"]["mismatches"] == 1 and pl["overall"]["compared_turns"] == 1


def test_a_resumed_run_keeps_the_environments_of_earlier_sessions_that_differ(tmp_path):
    import json

    from draftwise.bench.main import earlier_distinct

    def earlier_environments(out, current):
        return earlier_distinct(out, "environment", "earlier_environments", current)

    first, second = {"machine": {"cpu": "A"}, "threads": 2}, {"machine": {"cpu": "B"}, "threads": 2}
    assert earlier_environments(tmp_path, first) == []  # no earlier session
    (tmp_path / "session.json").write_text(json.dumps({"environment": first, "earlier_environments": []}))
    assert earlier_environments(tmp_path, first) == []  # same machine: nothing to flag
    assert earlier_environments(tmp_path, second) == [first]
    (tmp_path / "session.json").write_text(json.dumps({"environment": second, "earlier_environments": [first]}))
    assert earlier_environments(tmp_path, first) == [second]


def test_rest_answers_from_before_the_retrieval_phase_book_their_proposal_time_as_retrieval():
    from draftwise.bench.summary import _retrieval_split

    old = answer("a", "x", turn([1, 2], 1.0, phases={"propose": 0.2, "verify": 0.5}))
    new = answer("b", "x", turn([1, 2], 1.0, phases={"propose": 0.0, "retrieval": 0.3, "verify": 0.5}))
    assert _retrieval_split(old).turns[0].phase_seconds == {"propose": 0.0, "retrieval": 0.2, "verify": 0.5}
    assert _retrieval_split(new) == new
    m = method_metrics([_retrieval_split(old), new], None, check_exact=True)
    assert m.time_split_ms["retrieval"] == pytest.approx((0.2 + 0.3) / 4 * 1e3)


def test_failures_stay_out_of_the_spec_bench_answer_file_and_are_not_retried(tmp_path):
    import json

    from draftwise.bench.store import ResultStore

    store = ResultStore(tmp_path)
    store.open({"seed": 0}, resume=False)
    store.append(answer("a", "x", turn([1, 2], 0.5)), "model")
    store.append(Answer("m", "b", "x", (), (), error="ContextOverflow: too long"), "model")
    lines = [json.loads(line) for line in store.path("m").read_text().splitlines()]
    assert [row["question_id"] for row in lines] == ["a"]  # every line a real answer: Spec-Bench's scripts divide by it
    assert all(sum(row["choices"][0]["new_tokens"]) > 0 for row in lines)
    loaded = store.load("m")
    assert sorted(loaded) == ["a", "b"] and loaded["b"].error == "ContextOverflow: too long"  # resume skips both

    store.append(answer("b", "x", turn([3], 0.25)), "model")  # answered later (e.g. the failure file kept by hand)
    assert store.load("m")["b"].error is None


def test_a_resumed_run_keeps_earlier_gate_profiles_that_differ(tmp_path):
    import json

    from draftwise.bench.main import earlier_distinct

    before, now = {"gated": {"rows": [1, 2], "relative": [1.0, 1.4]}}, {"gated": {"rows": [1, 2], "relative": [1.0, 1.9]}}
    (tmp_path / "session.json").write_text(json.dumps({"gate_profiles": before}))
    assert earlier_distinct(tmp_path, "gate_profiles", "earlier_gate_profiles", before) == []
    assert earlier_distinct(tmp_path, "gate_profiles", "earlier_gate_profiles", now) == [before]


def test_two_retries_in_one_second_keep_both_failure_records(tmp_path, monkeypatch):
    import time

    from draftwise.bench.store import ResultStore

    monkeypatch.setattr(time, "gmtime", lambda *_: time.struct_time((2026, 11, 30, 12, 0, 0, 0, 334, 0)))
    store = ResultStore(tmp_path)
    store.open({"seed": 0}, resume=False)
    asides = []
    for question in ("a", "b"):
        store.append(Answer("m", question, "x", (), (), error=f"failed {question}"), "model")
        asides.append(store.set_failures_aside())
    assert [p.name for p in asides] == ["retried-20261130T120000", "retried-20261130T120000-2"]
    assert [sorted(store._read(p / "m.jsonl")) for p in asides] == [["a"], ["b"]]
    assert store.set_failures_aside() is None  # nothing left to retry


def test_per_source_acceptance_sums_over_turns_and_survives_the_answer_file():
    from dataclasses import replace

    # b was saved before the gate counted the rounds it did not ask a source (three counts)
    a = replace(turn([1, 2, 3], 1.0), by_source={"prompt-lookup": [2, 20, 3, 0], "hydra": [4, 8, 2, 5]})
    b = replace(turn([4, 5], 1.0), by_source={"prompt-lookup": [1, 10, 0], "hydra": [2, 4, 1]})
    assert TurnOutput.from_dict(a.as_dict()).by_source == a.by_source
    m = method_metrics([answer("q1", "x", a, b)], None, check_exact=False)
    assert m.acceptance_by_source == {
        "prompt-lookup": {"rounds": 3, "rows": 30, "accepted": 3, "accepted_per_round": 1.0, "unasked": 0},
        "hydra": {"rounds": 6, "rows": 12, "accepted": 3, "accepted_per_round": 0.5, "unasked": 5}}
    assert method_metrics([answer("q1", "x", turn([1], 1.0))], None, check_exact=False).acceptance_by_source is None
