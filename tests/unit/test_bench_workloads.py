"""Workload SPEC parsing: Spec-Bench (multi-turn, categories, stratified limit), HumanEval ranges, prompt files."""

import json

import pytest

from draftwise.workloads import (
    HUMANEVAL_INSTRUCTION,
    Question,
    WorkloadError,
    messages_for,
    parse_workload,
    parse_workloads,
    stratified,
)


@pytest.fixture
def specbench(tmp_path):
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["w1a", "w1b"]},
        {"question_id": 2, "category": "writing", "turns": ["w2a", "w2b"]},
        {"question_id": 3, "category": "qa", "turns": ["q3"]},
        {"question_id": 4, "category": "qa", "turns": ["q4"]},
        {"question_id": 5, "category": "qa", "turns": ["q5"]},
        {"question_id": 6, "category": "rag", "turns": ["r6"]},
    ]
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_specbench_all(specbench):
    w = parse_workload(f"specbench:{specbench}")
    assert [q.question_id for q in w.questions] == ["1", "2", "3", "4", "5", "6"]
    assert w.questions[0].turns == ("w1a", "w1b")
    assert w.categories == ("writing", "qa", "rag")


def test_specbench_category_filter_and_limit(specbench):
    assert [q.question_id for q in parse_workload(f"specbench:{specbench}:qa").questions] == ["3", "4", "5"]
    assert [q.question_id for q in parse_workload(f"specbench:{specbench}:qa,rag:2").questions] == ["3", "6"]
    assert [q.question_id for q in parse_workload(f"specbench:{specbench}:qa:2").questions] == ["3", "4"]


def test_specbench_limit_is_stratified_over_all_categories(specbench):
    # round-robin: writing 1, qa 3, rag 6, then writing 2 ... restored to file order
    assert [q.question_id for q in parse_workload(f"specbench:{specbench}:all:4").questions] == ["1", "2", "3", "6"]
    assert [q.question_id for q in parse_workload(f"specbench:{specbench}:4").questions] == ["1", "2", "3", "6"]
    assert len(parse_workload(f"specbench:{specbench}:all:100").questions) == 6


def test_packaged_spec_bench_dev_split():
    """`spec-bench` reads the development split shipped inside the package (no path outside it)."""
    from draftwise.data import spec_bench_questions

    path = spec_bench_questions()
    assert path.is_file() and (path.parent / "LICENSE").is_file() and (path.parent / "NOTICE").is_file()
    every = parse_workload("spec-bench")
    assert len(every.questions) == 240 and len(every.categories) == 13
    assert every.questions == parse_workload(f"specbench:{path}").questions
    three = parse_workload("spec-bench:3")
    assert [q.category for q in three.questions] == ["writing", "roleplay", "reasoning"]
    assert three.questions == parse_workload(f"specbench:{path}:3").questions
    assert {q.category for q in parse_workload("spec-bench:qa,rag:4").questions} == {"qa", "rag"}


def test_stratified_keeps_file_order():
    qs = tuple(Question(str(i), "ab"[i % 2], ("t",)) for i in range(6))
    assert [q.question_id for q in stratified(qs, 3)] == ["0", "1", "2"]


def test_specbench_errors(specbench, tmp_path):
    with pytest.raises(WorkloadError, match="not found"):
        parse_workload(f"specbench:{tmp_path}/missing.jsonl")
    with pytest.raises(WorkloadError, match="no questions in categories"):
        parse_workload(f"specbench:{specbench}:poetry")
    with pytest.raises(WorkloadError, match="LIMIT"):
        parse_workload(f"specbench:{specbench}:qa:x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1}\n')
    with pytest.raises(WorkloadError, match="bad.jsonl:1"):
        parse_workload(f"specbench:{bad}")
    with pytest.raises(WorkloadError, match="unknown workload kind"):
        parse_workload("mtbench:x")


def test_humaneval_range():
    w = parse_workload("humaneval:0-2")
    assert [q.question_id for q in w.questions] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert w.questions[0].category == "humaneval"
    assert w.questions[0].turns[0].startswith(HUMANEVAL_INSTRUCTION)
    assert "def has_close_elements" in w.questions[0].turns[0]
    assert [q.question_id for q in parse_workload("humaneval:5").questions] == ["HumanEval/5"]
    for bad in ("humaneval:3-1", "humaneval:0-999", "humaneval:a-b"):
        with pytest.raises(WorkloadError):
            parse_workload(bad)


def test_prompt_files(tmp_path):
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    assert [q.turns for q in parse_workload(f"prompts:{plain}").questions] == [("first prompt",), ("second prompt",)]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    w = parse_workload(f"prompts:{jsonl}")
    assert [q.turns[0] for q in w.questions] == ["a", "b"] and w.categories == ("prompts",)
    jsonl.write_text('{"text": "a"}\n')
    with pytest.raises(WorkloadError, match="prompt"):
        parse_workload(f"prompts:{jsonl}")


def test_several_workloads_and_duplicate_ids(specbench):
    w = parse_workloads(["humaneval:0-1", f"specbench:{specbench}:rag"])
    assert len(w.questions) == 3 and w.categories == ("humaneval", "rag")
    with pytest.raises(WorkloadError, match="repeat"):
        parse_workloads([f"specbench:{specbench}", f"specbench:{specbench}"])


def test_multi_turn_messages_carry_own_answers():
    q = Question("1", "writing", ("first", "second"))
    assert messages_for(q, 0, []) == [{"role": "user", "content": "first"}]
    assert messages_for(q, 1, ["answer one"]) == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"},
    ]


def test_the_packaged_chat_calibration_and_joined_workloads():
    from draftwise.spec import CALIBRATION_WORKLOAD

    chat = parse_workload("chat-calibration")
    assert len(chat.questions) == 3 and chat.categories == ("chat",)
    assert all(q.turns[0].strip() for q in chat.questions)
    joined = parse_workload(CALIBRATION_WORKLOAD)
    assert [q.category for q in joined.questions] == ["humaneval", "humaneval", "chat", "chat", "chat"]
    with pytest.raises(WorkloadError, match="takes no arguments"):
        parse_workload("chat-calibration:3")
    with pytest.raises(WorkloadError, match="repeat"):
        parse_workload("chat-calibration+chat-calibration")
