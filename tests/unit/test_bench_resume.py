"""End to end on the embedded model (transformers backend): a run interrupted after the first
prompt resumes without redoing it, and the summary covers both prompts with no mismatches."""

import io
import json

import pytest
from rich.console import Console

import draftwise.bench.main as bench_main
import draftwise.bench.runner as runner
from draftwise.bench.main import run_bench
from draftwise.bench.pool import ModelPool
from draftwise.bench.runner import BenchSettings
from draftwise.bench.store import StoreError

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def pool():
    return ModelPool(threads=1, seed=0)  # one model load shared by both sessions


@pytest.fixture
def fixed_noise_verdict(monkeypatch):
    """The noise check (a short generation timed six times, before and after every run: most of
    these tests' forwards) is recorded by the first test; the others read neither its numbers nor
    its verdict, so a fixed one stands in."""
    monkeypatch.setattr(bench_main, "check_noise", lambda executors, question: {"method": "fixed", "reliable": True})


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
    noise = json.loads((out / "session.json").read_text())["noise"]  # the machine's steadiness, checked on the first method
    assert set(noise) == {"start", "end"} and all(c["method"] == "plain" and c["cv"] >= 0 for c in noise.values())
    report = (out / "report.md").read_text()
    assert "identical to plain" in report
    # memory is in the report, not only in summary.json: the run's peak and each method's RSS after loading
    assert f"{summary['peak_rss_mb']:.0f} MB" in report and summary["peak_rss_mb"] > 0
    assert f"| plain | {plain['config']} | plain | {plain['rss_after_load_mb']:.0f} |" in report

    changed = BenchSettings(**{**settings(prompts).__dict__, "max_new_tokens": 9})
    with pytest.raises(StoreError, match="max_new_tokens"):
        run_bench(changed, out, resume=True, show_progress=False, pool=pool)


def test_a_gated_method_records_the_cost_profile_its_gate_decided_by_and_a_log_gets_progress_lines(tmp_path, pool,
                                                                                                    fixed_noise_verdict):
    from draftwise.models import resolve
    from draftwise.runtime.cost_profile import VerifyCostProfile

    profile_dir = tmp_path / "profile"
    VerifyCostProfile.from_absolute([1, 2, 4, 8], [0.01, 0.012, 0.015, 0.03], model=resolve("smollm2-135m").checkpoint_id,
                                    backend="transformers", threads=1, machine="test").save(profile_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count from one to ten.\n")
    gated = BenchSettings(workloads=(f"prompts:{prompts}",),
                          methods=("plain=dw:proposer=none,backend=transformers",
                                   f"gated=dw:proposer=prompt-lookup,backend=transformers,gate={profile_dir}"),
                          target="smollm2-135m", max_new_tokens=8, threads=1, warmup_tokens=2)
    log = io.StringIO()  # not a terminal: progress comes as one line per generation, not as a bar
    summary = run_bench(gated, tmp_path / "run", console=Console(file=log, width=200), pool=pool)
    assert "bench 1/2: plain answered prompts-1" in log.getvalue()
    assert "bench 2/2: gated answered prompts-1" in log.getvalue()
    recorded = json.loads((tmp_path / "run" / "session.json").read_text())["gate_profiles"]
    assert list(recorded) == ["gated"]  # plain decoding has no gate
    assert recorded["gated"]["rows"] == [1, 2, 4, 8] and recorded["gated"]["relative"] == [1.0, 1.2, 1.5, 3.0]
    assert summary["gate_profiles"] == recorded and summary["earlier_gate_profiles"] == []
    assert recorded["gated"]["model"] == resolve("smollm2-135m").checkpoint_id  # the whole profile, as saved

    resumed = run_bench(gated, tmp_path / "run", resume=True, console=Console(file=io.StringIO()), pool=pool)
    assert resumed["earlier_gate_profiles"] == []  # the same profile read back is not a re-measured one


def test_a_failed_question_is_kept_out_of_answers_and_runs_again_only_when_retried(tmp_path, pool, monkeypatch,
                                                                                   fixed_noise_verdict):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Count from one to ten.\nList three colours.\n")
    out = tmp_path / "run"
    real = runner.answer_question
    asked: list[tuple[str, str]] = []

    def pl_fails_on_first(executor, question):
        asked.append((executor.method.name, question.question_id))
        if executor.method.name == "pl" and question.question_id.endswith("-1"):
            raise RuntimeError("planted backend failure")
        return real(executor, question)

    monkeypatch.setattr(runner, "answer_question", pl_fails_on_first)
    summary = run_bench(settings(prompts), out, show_progress=False, pool=pool)
    assert summary["methods"]["pl"]["overall"]["errors"] == 1
    failure = json.loads((out / "failures" / "pl.jsonl").read_text())
    assert failure["question_id"] == "prompts-1" and "planted backend failure" in failure["draftwise"]["error"]
    assert (out / "answers" / "pl.jsonl").read_text().count("\n") == 1  # only the question it answered

    asked.clear()
    run_bench(settings(prompts), out, resume=True, show_progress=False, pool=pool)
    assert asked == []  # a plain resume does not retry a failure

    with pytest.raises(StoreError, match="--resume"):
        run_bench(settings(prompts), out, show_progress=False, pool=pool, retry_failures=True)

    monkeypatch.setattr(runner, "answer_question", lambda e, q: asked.append((e.method.name, q.question_id)) or real(e, q))
    summary = run_bench(settings(prompts), out, resume=True, show_progress=False, pool=pool, retry_failures=True)
    assert asked == [("pl", "prompts-1")]  # only the failed pair ran again
    assert summary["methods"]["pl"]["overall"]["errors"] == 0
    assert summary["methods"]["pl"]["overall"]["questions"] == 2 and summary["methods"]["pl"]["overall"]["mismatches"] == 0
    assert not (out / "failures" / "pl.jsonl").exists()
    (aside,) = (out / "failures").glob("retried-*/pl.jsonl")  # the record of the failure is kept
    assert json.loads(aside.read_text())["question_id"] == "prompts-1"
