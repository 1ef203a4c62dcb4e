"""One benchmark session end to end: plan, load, warm up, run (resumable), summarize, report."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from draftwise.bench.env import environment
from draftwise.bench.plots import write_plots
from draftwise.bench.pool import ModelPool
from draftwise.bench.report import write_report
from draftwise.bench.runner import (
    BenchSettings,
    Session,
    make_plan,
    peak_rss_mb,
    pending_generations,
    prepare_all,
    run_questions,
    warm_up,
)
from draftwise.bench.store import ResultStore
from draftwise.bench.summary import write_summary


def run_bench(settings: BenchSettings, out: Path, resume: bool = False, console: Console | None = None,
              show_progress: bool = True, pool: ModelPool | None = None) -> dict:
    """`pool` lets a caller that runs several benchmarks (tests, notebooks) load each model once."""
    console = console or Console(stderr=True)
    say: Callable[[str], None] = lambda message: console.print(f"[dim]{message}[/]")  # noqa: E731
    plan = make_plan(settings)  # every config error surfaces before a model is loaded
    store = ResultStore(out)
    store.open(settings.as_dict(), resume)
    session = Session()
    pool = pool or ModelPool(settings.threads, settings.seed, progress=say)
    executors = prepare_all(plan, pool, session)
    if executors:
        say(f"warm-up: {len(executors)} method(s), {settings.warmup_tokens} tokens each")
        warm_up(executors, plan.workload.questions[0], settings.warmup_tokens, session)
    for name, reason in session.skipped.items():
        console.print(f"[yellow]skipped[/] {name}: {reason}")
    models = {m.target for m in plan.methods} | {m.draft for m in plan.methods if m.draft}
    env = environment(settings.threads, models)
    earlier = earlier_environments(out, env) if resume else []

    def record_session() -> None:
        store.write_json("session.json", {**asdict(session), "peak_rss_mb": round(peak_rss_mb(), 1), "environment": env,
                                          "earlier_environments": earlier})

    record_session()  # before the timed part too: a run stopped midway still says where it ran
    total = pending_generations(plan, executors, store)
    columns = (TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not show_progress) as progress:
        task = progress.add_task("bench", total=total)
        run_questions(plan, executors, store, lambda: progress.advance(task))
    record_session()
    return finish(out)


def earlier_environments(out: Path, current: dict) -> list[dict]:
    """The environments of the sessions before this one that differ from it: a resumed run
    whose answers were measured on other machines, libraries or models says so."""
    path = out / "session.json"
    if not path.is_file():
        return []
    previous = json.loads(path.read_text())
    found = [*previous.get("earlier_environments", []), previous.get("environment")]
    distinct: list[dict] = []
    for env in found:
        if env and env != current and env not in distinct:
            distinct.append(env)
    return distinct


def finish(out: Path) -> dict:
    """summary.json, plots and report.md from what is on disk."""
    summary = write_summary(out)
    plots = write_plots(summary, out)
    write_report(summary, out, plots)
    return summary
