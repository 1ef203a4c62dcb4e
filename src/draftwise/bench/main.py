"""One benchmark session end to end: plan, load, warm up, run (resumable), summarize, report."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from draftwise.bench.cells import CellStore
from draftwise.bench.concurrency_run import pending_cells, run_concurrency
from draftwise.bench.env import environment
from draftwise.bench.pool import ModelPool
from draftwise.bench.report import write_report
from draftwise.bench.runner import (
    BenchSettings,
    Session,
    check_noise,
    make_plan,
    peak_rss_mb,
    pending_generations,
    prepare_all,
    run_questions,
    warm_up,
)
from draftwise.bench.store import ResultStore, StoreError
from draftwise.bench.summary import write_summary
from draftwise.logs import progress_to


def run_bench(settings: BenchSettings, out: Path, resume: bool = False, console: Console | None = None,
              show_progress: bool = True, pool: ModelPool | None = None, retry_failures: bool = False) -> dict:
    """`pool` lets a caller that runs several benchmarks (tests, notebooks) load each model once.
    `retry_failures` (with `resume`) runs the questions a method failed on again."""
    console = console or Console(stderr=True)
    def say(message: str) -> None:
        console.print(message, style="dim", markup=False, highlight=False)

    if retry_failures and not resume:
        raise StoreError("--retry-failures continues an earlier run: pass --resume as well")
    plan = make_plan(settings)  # every config error surfaces before a model is loaded
    store = ResultStore(out)
    store.open(settings.as_dict(), resume)
    if retry_failures and (aside := store.set_failures_aside()) is not None:
        say(f"retrying failed questions; their failure lines are kept in {aside}")
    session = Session()
    pool = pool or ModelPool(settings.threads, settings.seed, progress=say, dtype=settings.dtype)
    with progress_to(say):  # the library's own lines (models pulled, profiles measured, auto choices)
        executors = prepare_all(plan, pool, session)
        if executors:
            say(f"warm-up: {len(executors)} method(s), {settings.warmup_tokens} tokens each")
            warm_up(executors, plan.workload.questions[0], settings.warmup_tokens, session)
            session.noise["start"] = check_noise(executors, plan.workload.questions[0])
    for name, reason in session.skipped.items():
        console.print(f"[yellow]skipped[/] {name}: {reason}")
    models = {m.target for m in plan.methods} | {m.draft for m in plan.methods if m.draft}
    env = environment(settings.threads, models)
    earlier = earlier_distinct(out, "environment", "earlier_environments", env) if resume else []
    earlier_gates = (earlier_distinct(out, "gate_profiles", "earlier_gate_profiles", session.gate_profiles)
                     if resume else [])

    def record_session() -> None:
        store.write_json("session.json", {**asdict(session), "peak_rss_mb": round(peak_rss_mb(), 1), "environment": env,
                                          "earlier_environments": earlier, "earlier_gate_profiles": earlier_gates})

    record_session()  # before the timed part too: a run stopped midway still says where it ran
    cells = CellStore(out)
    total = pending_generations(plan, executors, store) + pending_cells(plan, executors, cells)
    columns = (TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    started = time.perf_counter()
    with Progress(*columns, console=console, disable=not show_progress) as progress:
        task = progress.add_task("bench", total=total)

        def advance(method: str, question_id: str) -> None:
            progress.advance(task)
            if show_progress and not console.is_terminal:  # a log file gets one line per generation instead of a bar
                done = int(progress.tasks[0].completed)
                console.print(f"bench {done}/{total}: {method} answered {question_id} "
                              f"({(time.perf_counter() - started) / 60:.1f} min)", highlight=False)

        try:
            run_questions(plan, executors, store, advance)
            run_concurrency(plan, executors, cells, lambda method, batch: advance(method, f"B={batch}"))
        finally:
            for executor in executors.values():  # what runs in processes of its own (vLLM's engines) ends here
                close = getattr(executor, "close", None)
                if callable(close):
                    close()
    if executors:
        session.noise["end"] = check_noise(executors, plan.workload.questions[0])
        for when, check in session.noise.items():
            if check.get("reliable") is False:
                console.print(f"[yellow]noise check ({when} of the timed part)[/]: {check['verdict']}")
    record_session()
    return finish(out)


def earlier_distinct(out: Path, key: str, earlier_key: str, current: object) -> list:
    """What the sessions before this one recorded under `key` (their environment, their gates'
    cost profiles) where it differs from this session's: a resumed run whose answers were
    measured on other machines, libraries, models or gate profiles says so."""
    path = out / "session.json"
    if not path.is_file():
        return []
    previous = json.loads(path.read_text())
    found = [*previous.get(earlier_key, []), previous.get(key)]
    distinct: list = []
    for value in found:
        if value and value != current and value not in distinct:
            distinct.append(value)
    return distinct


def finish(out: Path) -> dict:
    """summary.json, plots and report.md from what is on disk."""
    from draftwise.bench.plots import write_plots  # matplotlib (the bench extra) only when plotting

    summary = write_summary(out)
    plots = write_plots(summary, out)
    write_report(summary, out, plots)
    return summary
