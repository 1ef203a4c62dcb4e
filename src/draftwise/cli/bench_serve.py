"""`draftwise bench serve`: OpenAI-compatible servers side by side under closed- and open-loop
load (the benchmark lives in `draftwise.bench.serving`; this module only reads the options)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Optional

import typer

from draftwise.bench.serving.loadgen import CLOSED
from draftwise.bench.serving.servers import BUILTIN, SERVER_FORMS, ServerError
from draftwise.bench.serving.settings import ServeBenchSettings
from draftwise.cli.common import err, fail
from draftwise.errors import DraftwiseError

DEFAULTS = ServeBenchSettings()
def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


DEFAULT_CONCURRENCY = ",".join(f"{load.value:g}" for load in DEFAULTS.loads if load.mode == CLOSED)


def serve_cmd(
    out: Path = typer.Option(..., help="Result directory (results.json, summary.json, report.md, plots, logs/)."),
    servers: str = typer.Option(",".join(BUILTIN), help=f"Comma-separated servers, run one at a time: {SERVER_FORMS}."),
    server: list[str] = typer.Option([], help="Define a server: NAME=KIND[:ARGS] (repeatable), e.g. "
                                     "'lookup=draftwise:--proposer prompt-lookup'; name it in --servers."),
    concurrency: str = typer.Option(DEFAULT_CONCURRENCY,
                                    help="Closed-loop levels: concurrent requests, comma-separated ('' for none)."),
    rates: str = typer.Option("", help="Open-loop levels: Poisson request rates in req/s, comma-separated (inf: all at once)."),
    num_prompts: int = typer.Option(DEFAULTS.num_prompts, help="Prompts per cell: the workload's first N first turns."),
    max_tokens: int = typer.Option(DEFAULTS.max_tokens),
    workload: str = typer.Option(DEFAULTS.workload, help="As for `draftwise bench` (spec-bench[:CATS][:N], humaneval:A-B, prompts:PATH, ...)."),
    endpoint: str = typer.Option(DEFAULTS.endpoint, help="completions (the turn as a raw prompt) | chat (as a user message)."),
    temperature: float = typer.Option(DEFAULTS.temperature, help="0 = greedy (texts then compared with draftwise-none's)."),
    seed: int = typer.Option(DEFAULTS.seed, help="Every request's seed and the open loop's arrivals."),
    repeats: int = typer.Option(DEFAULTS.repeats, help="Cells per (server, load), servers rotated each repeat."),
    target: str = typer.Option(DEFAULTS.target, help="The model every server serves (a GGUF for llama_cpp.server)."),
    backend: str = typer.Option(DEFAULTS.backend, help="draftwise servers' --backend."),
    threads: Optional[int] = typer.Option(DEFAULTS.threads, help="CPU threads of every server (default: all cores)."),
    request_timeout: float = typer.Option(DEFAULTS.request_timeout_s, help="Seconds per request."),
    startup_timeout: float = typer.Option(DEFAULTS.startup_timeout_s, help="Seconds a server may take to listen."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out: cells already there are skipped."),
) -> None:
    """Benchmark OpenAI-compatible servers: output tok/s, TTFT, TPOT, ITL (vLLM's conventions)."""
    from draftwise.bench.serving.run import run_serving_bench
    from draftwise.bench.serving.settings import parse_loads, parse_servers

    try:
        settings = ServeBenchSettings(
            servers=parse_servers(servers, server), loads=parse_loads(concurrency, rates), workload=workload,
            num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature, seed=seed, endpoint=endpoint,
            repeats=repeats, target=target, backend=backend, threads=threads, request_timeout_s=request_timeout,
            startup_timeout_s=startup_timeout)
        # SIGTERM ends the run through the
        # servers' `finally`: none is left running behind the benchmark
        signal.signal(signal.SIGTERM, _exit_on_signal)
        run_serving_bench(settings, out, resume=resume, say=lambda line: err.print(line, markup=False, highlight=False))
    except (DraftwiseError, ServerError) as exc:
        fail(str(exc))
        return
    err.print(f"report: {out / 'report.md'}")
