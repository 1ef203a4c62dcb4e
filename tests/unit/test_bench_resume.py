"""End to end on the embedded model (transformers backend): a run interrupted after the first
prompt resumes without redoing it, and the summary covers both prompts with no mismatches."""

import json

import pytest

import draftwise.bench.runner as runner
from draftwise.bench.main import run_bench
from draftwise.bench.pool import ModelPool
from draftwise.bench.runner import BenchSettings
from draftwise.bench.store import StoreError

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def pool():
    return ModelPool(threads=1, seed=0)  # one model load shared by both sessions


def settings(prompts):
    return BenchSettings(workloads=(f"prompts:{prompts}",),
                         methods=("plain=dw:proposer=none,backend=transformers",
                                  "pl=dw:proposer=prompt-lookup,backend=transformers"),
                         target="smollm2-135m", max_new_tokens=8, threads=1, warmup_tokens=2)


def test_interrupted_run_resumes_without_redoing(tmp_path, pool, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count from one to ten.\nList three colours.\n")
    out = tmp_path / "run"
    real = runner.answer_question
    asked: list[str] = []

    def interrupt_on_second(executor, question):
        if question.question_id.endswith("-2"):
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C during the second prompt
        asked.append(question.question_id)
        return real(executor, question)

    monkeypatch.setattr(runner, "answer_question", interrupt_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_bench(settings(prompts), out, show_progress=False, pool=pool)
    assert asked == ["prompts-1", "prompts-1"]
    first_lines = {m: (out / "answers" / f"{m}.jsonl").read_text() for m in ("plain", "pl")}
    assert all(text.count("\n") == 1 for text in first_lines.values())
    # written before the timed part: the interrupted session still says where it ran
    assert json.loads((out / "session.json").read_text())["environment"]["threads"] == 1

    with pytest.raises(StoreError, match="--resume"):
        run_bench(settings(prompts), out, show_progress=False, pool=pool)

    asked.clear()
    monkeypatch.setattr(runner, "answer_question", lambda e, q: asked.append(q.question_id) or real(e, q))
    summary = run_bench(settings(prompts), out, resume=True, show_progress=False, pool=pool)
    assert asked == ["prompts-2", "prompts-2"]  # the first prompt was not redone
    for method, before in first_lines.items():
        after = (out / "answers" / f"{method}.jsonl").read_text()
        assert after.startswith(before) and after.count("\n") == 2

    plain, pl = summary["methods"]["plain"], summary["methods"]["pl"]
    assert plain["overall"]["questions"] == pl["overall"]["questions"] == 2
    assert pl["reference"] == "plain" and pl["overall"]["mismatches"] == 0
    assert pl["overall"]["speedup"] is not None and pl["overall"]["time_split_ms"]["verify"] > 0
    assert pl["overall"]["max_provisional_kv_bytes"] > 0 and pl["overall"]["compared_turns"] == 2
    assert json.loads((out / "summary.json").read_text())["earlier_environments"] == []  # same machine throughout
    for name in ("summary.json", "report.md", "session.json"):
        assert (out / name).is_file()
    assert json.loads((out / "summary.json").read_text())["environment"]["threads"] == 1
    assert "identical to plain" in (out / "report.md").read_text()

    changed = BenchSettings(**{**settings(prompts).__dict__, "max_new_tokens": 9})
    with pytest.raises(StoreError, match="max_new_tokens"):
        run_bench(changed, out, resume=True, show_progress=False, pool=pool)
