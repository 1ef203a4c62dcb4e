"""One serving benchmark session: the servers one at a time (alone on the machine), every load
level of a server while it is up, repeats interleaved (the server order rotates each repeat, so
no server always runs first), each finished cell saved at once so that `--resume` continues.

A cell is (server, load, repeat): every prompt once, after one unrecorded warm-up request on
the freshly started server (vLLM's "initial test run")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

from draftwise.measure.load import default_threads
from draftwise.bench.env import environment
from draftwise.bench.serving.loadgen import CLOSED, CellRun, Endpoint, Load, Sampling, run_cell
from draftwise.bench.serving.metrics import cell_metrics
from draftwise.bench.serving.report import write_report
from draftwise.bench.serving.servers import LLAMACPP, NEUTRAL_FIELDS, LaunchConfig, ServerError, ServerSpec, running
from draftwise.bench.serving.settings import ServeBenchSettings, check, first_turns
from draftwise.errors import InputError
from draftwise.models import resolve

RESULTS = "results.json"
# settings a resumed run must share with the cells it continues; servers, loads and repeats may
# change (a server or a level can be added to a run, and more repeats asked)
SHARED = ("workload", "num_prompts", "max_tokens", "temperature", "seed", "endpoint", "target", "backend", "threads")
WARM_UP_TOKENS = 8


def run_serving_bench(settings: ServeBenchSettings, out: Path, resume: bool = False,
                      say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every missing cell, then write summary.json, report.md and the plots; the summary."""
    settings = check(settings)
    prompts = first_turns(settings.workload, settings.num_prompts)
    results = _open_results(out, settings, resume)
    config = _launch_config(settings, out)
    done = {(c["server"], c["mode"], c["value"], c["repeat"]) for c in results["cells"]}
    for repeat in range(settings.repeats):
        shift = repeat % len(settings.servers)
        for spec in settings.servers[shift:] + settings.servers[:shift]:
            todo = [load for load in settings.loads if (spec.name, load.mode, load.value, repeat) not in done]
            if todo:
                _check_same_server(results["cells"], spec)
                _run_server(spec, config, todo, repeat, prompts, settings, results, out, say)
    return write_report(out, results)


def _run_server(spec: ServerSpec, config: LaunchConfig, loads: list[Load], repeat: int, prompts: list[str],
                settings: ServeBenchSettings, results: dict[str, Any], out: Path, say: Callable[[str], None]) -> None:
    say(f"repeat {repeat}: starting {spec.name} ({spec.kind} {' '.join(spec.args)})")
    with running(spec, config) as server:
        endpoint = Endpoint(server.base_url, server.model_id, settings.endpoint, NEUTRAL_FIELDS[spec.kind])
        _warm_up(endpoint, prompts[0], settings)
        for load in loads:
            run = asyncio.run(run_cell(endpoint, prompts, load, settings.sampling, settings.request_timeout_s))
            results["cells"].append(_cell(spec, load, repeat, run))
            _save(out, results)
            m = cell_metrics(run.records, run.duration_s)
            ttft = f"{m.ttft.p50 * 1e3:.0f} ms" if m.ttft.p50 is not None else "-"
            say(f"  {spec.name} {load.label} repeat {repeat}: {m.output_throughput:.2f} tok/s, "
                f"{m.request_throughput:.3f} req/s, TTFT p50 {ttft}, {m.completed} done, {m.failed} failed")


def _warm_up(endpoint: Endpoint, prompt: str, settings: ServeBenchSettings) -> None:
    sampling = Sampling(min(WARM_UP_TOKENS, settings.max_tokens), settings.temperature, settings.seed)
    run = asyncio.run(run_cell(endpoint, [prompt], Load(CLOSED, 1), sampling, settings.request_timeout_s))
    if not run.records[0].ok:
        raise ServerError(f"the warm-up request failed: {run.records[0].error or 'no text came back'}")


def _launch_config(settings: ServeBenchSettings, out: Path) -> LaunchConfig:
    model = resolve(settings.target)
    if model.kind != "gguf" and any(s.kind == LLAMACPP for s in settings.servers):
        raise InputError(f"llama_cpp.server needs a GGUF model; {settings.target!r} is a {model.kind}")
    return LaunchConfig(model=settings.target, gguf_path=model.path, backend=settings.backend,
                        threads=settings.threads or default_threads(), startup_timeout_s=settings.startup_timeout_s,
                        log_dir=out / "logs")


def _cell(spec: ServerSpec, load: Load, repeat: int, run: CellRun) -> dict[str, Any]:
    # the machine's 1-minute load average as the cell ends (the server under test counts in it):
    # on a shared machine it says how alone the server was
    return {"server": spec.name, "kind": spec.kind, "args": list(spec.args), "mode": load.mode, "value": load.value,
            "fields": dict(NEUTRAL_FIELDS[spec.kind]), "repeat": repeat, "duration_s": run.duration_s,
            "load_avg_1m": os.getloadavg()[0],
            "requests": [r.as_json() for r in run.records]}


def _open_results(out: Path, settings: ServeBenchSettings, resume: bool) -> dict[str, Any]:
    path = out / RESULTS
    fresh: dict[str, Any] = {"settings": settings.as_json(), "cells": [], "source": source_state(),
                             "environment": environment(settings.threads or default_threads(), {settings.target})}
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        return fresh
    if not resume:
        raise InputError(f"{path} exists: pass --resume to continue that run, or another --out")
    results: dict[str, Any] = json.loads(path.read_text())
    stored = results["settings"]
    differ = [k for k in SHARED if stored.get(k) != fresh["settings"][k]]
    if differ:
        raise InputError(f"--resume: {out} was run with other settings ({', '.join(differ)}); "
                         "use another --out")
    results["settings"] = fresh["settings"]  # the latest servers, loads and repeats
    return results


def source_state() -> dict[str, Any]:
    """The checkout the servers ran from (they run this draftwise): its commit and the package's
    files changed since, so that a run on uncommitted server code says so.  None outside git."""
    package = Path(__file__).resolve().parents[2]  # src/draftwise

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.rstrip() if done.returncode == 0 else None  # rstrip: status lines start with a space

    changed = git("status", "--porcelain", "--", ".")
    return {"commit": git("rev-parse", "HEAD"), "changed": None if changed is None else changed.splitlines()}


def _check_same_server(cells: list[dict[str, Any]], spec: ServerSpec) -> None:
    """A resumed run must not mix two servers under one name."""
    now = (spec.kind, list(spec.args), dict(NEUTRAL_FIELDS[spec.kind]))
    for cell in cells:
        if cell["server"] == spec.name and (cell["kind"], cell["args"], cell.get("fields")) != now:
            raise InputError(f"--resume: {spec.name} ran as {cell['kind']} {cell['args']} with request fields "
                             f"{cell.get('fields')} in this directory, now {now}; give it another name")


def _save(out: Path, results: dict[str, Any]) -> None:
    tmp = out / (RESULTS + ".tmp")
    tmp.write_text(json.dumps(results))
    tmp.replace(out / RESULTS)  # a run stopped mid-write leaves the previous file whole
