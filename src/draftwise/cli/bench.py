"""`draftwise bench`: a typer sub-app over `draftwise.bench` (the protocol, metrics and report live there).

`draftwise bench --workload ... --method ... --out DIR` runs (the callback does the work
when no subcommand is given); `draftwise bench compare A B` compares two result directories.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from draftwise.backends.dtype import DEFAULT_DTYPE
from draftwise.bench.methods import PEERS
from draftwise.cli.bench_serve import serve_cmd
from draftwise.cli.common import err, fail
from draftwise.errors import DraftwiseError
from draftwise.measure.load import default_threads
from draftwise.runtime.round import GenerationConfig
from draftwise.models import DEFAULT_MODEL

bench_app = typer.Typer(help="Benchmark draftwise methods against plain decoding and peers (Spec-Bench protocol).")
bench_app.command("serve")(serve_cmd)  # `draftwise bench serve`: OpenAI-compatible servers under load

METHOD_HELP = (
    "NAME=CONFIG (repeatable). CONFIG: dw[:key=value,...] (keys: proposer, backend, verifier, target, draft, k, "
    "confidence, tree, relation, lookup, ngram, candidates, index, max_nodes, max_depth, exact; dtype is the run's "
    "--dtype), a peer "
    f"({', '.join(PEERS)}) with optional :target=,draft=,tokens=,feed= (llamacpp-plain:feed=draftwise feeds the "
    "prompt as draftwise does, to compare like for like), or a .json/.toml file of the same keys."
)




@bench_app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    workload: list[str] = typer.Option([], help="spec-bench[:CATS][:N] (the packaged dev split) | specbench:PATH[:CATS][:N] | humaneval:A-B | prompts:PATH (repeatable)."),
    method: list[str] = typer.Option([], help=METHOD_HELP),
    out: Optional[Path] = typer.Option(None, help="Result directory (answers, summary.json, report.md, plots)."),
    target: str = typer.Option(DEFAULT_MODEL, help="Target model for every method that does not name its own."),
    draft: Optional[str] = typer.Option(None, help="Draft model for draft-model methods and hf-assisted."),
    max_new_tokens: int = typer.Option(GenerationConfig().max_new_tokens),
    temperature: float = typer.Option(0.0, help="0 = greedy (outputs are then checked against plain)."),
    seed: int = typer.Option(0),
    repeats: int = typer.Option(1, help="Runs per question and method; the median is kept."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for every backend (default: all cores)."),
    warmup_tokens: int = typer.Option(8, help="New tokens of each method's warm-up generation."),
    dtype: str = typer.Option(DEFAULT_DTYPE, help="dtype of every transformers model (draftwise's methods and the HF "
                              "peers share the object): float32 | bfloat16 | auto (measured once, cached). "
                              "llama.cpp methods run the GGUF's own types."),
    concurrency: Optional[str] = typer.Option(
        None, help="B values, e.g. 1,2,4,8: after the per-question pass, every method also decodes the first turns "
                   "with B requests in flight (closed loop), for each B, interleaved repeats (docs/bench.md)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out from its saved answers."),
    retry_failures: bool = typer.Option(False, "--retry-failures",
                                        help="With --resume: run again the questions a method failed on."),
    summarize_only: bool = typer.Option(False, "--summarize", help="Only rebuild summary, plots and report of --out."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Run a benchmark (when no subcommand is given)."""
    if ctx.invoked_subcommand is not None:
        return
    from draftwise.bench.concurrency_run import parse_concurrency
    from draftwise.bench.main import finish, run_bench
    from draftwise.bench.runner import BenchSettings

    if out is None:
        fail("--out DIR is required")
    if summarize_only:
        if not (out / "run.json").is_file():
            fail(f"{out} holds no benchmark run (no run.json)")
        summary = finish(out)
        _print_summary(summary, out)
        return
    try:
        settings = BenchSettings(workloads=tuple(workload), methods=tuple(method), target=target, draft=draft,
                                 max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, repeats=repeats,
                                 threads=threads or default_threads(), warmup_tokens=warmup_tokens, dtype=dtype,
                                 concurrency=parse_concurrency(concurrency) if concurrency else ())
        summary = run_bench(settings, out, resume=resume, console=err, show_progress=not quiet,
                            retry_failures=retry_failures)
    except DraftwiseError as exc:
        fail(str(exc))
        return
    _print_summary(summary, out)


def _print_summary(summary: dict, out: Path) -> None:
    table = Table("method", "tok/s", "speedup", "mean accepted", "mismatches", "status", title=f"draftwise bench: {out}")
    for name, m in summary["methods"].items():
        o = m["overall"]
        status = f"skipped: {m['skipped']}" if m["skipped"] and not o["questions"] else f"{o['questions']} questions"
        table.add_row(name, f"{o['tokens_per_s']:.3f}", _num(o["speedup"]), _num(o["mean_accepted"]),
                      _num(o["mismatches"]), status)
    Console().print(table)
    if summary.get("concurrency"):
        _print_concurrency(summary["concurrency"])
    err.print(f"report: {out / 'report.md'}")


def _print_concurrency(concurrency: dict) -> None:
    table = Table("method", "B", "total tok/s", "x ref", "TTFT p50 ms", "ITL p50 / p99 ms", "exact vs plain",
                  title="requests in flight (closed loop, medians of the repeats)")
    for name, rows in concurrency["methods"].items():
        for batch, row in rows.items():
            if "refused" in row:
                table.add_row(name, batch, f"refused: {row['refused']}", "", "", "", "")
                continue
            exact = row["exact_vs_plain"]
            table.add_row(name, batch, _num(row["total_tokens_per_s"]), _num(row["vs_reference"]),
                          _num(row["ttft_p50_ms"]), f"{_num(row['itl_p50_ms'])} / {_num(row['itl_p99_ms'])}",
                          "–" if exact is None else f"{exact['compared'] - exact['mismatches']}/{exact['compared']}")
    Console().print(table)


def _num(value) -> str:
    return "–" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))


@bench_app.command("compare")
def compare_cmd(
    a: Path = typer.Argument(..., help="Baseline result directory."),
    b: Path = typer.Argument(..., help="New result directory."),
    categories: bool = typer.Option(False, "--categories", help="Also compare per category."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Per-method ratio changes (B / A) between two result directories."""
    from draftwise.bench.compare import compare, load_summary, method_differences, settings_differences

    try:
        sa, sb = load_summary(a), load_summary(b)
    except FileNotFoundError as exc:
        fail(str(exc))
        return
    changes, only_a, only_b = compare(sa, sb, categories)
    differences = settings_differences(sa, sb)
    unlike = method_differences(sa, sb)
    if as_json:
        print(json.dumps({"changes": [asdict(c) for c in changes], "only_in_a": only_a, "only_in_b": only_b,
                          "settings_differences": differences, "method_differences": unlike}))
        return
    table = Table("method", "scope", "tok/s A → B", "×", "speedup A → B", "×", "mean accepted A → B", "mismatches A → B",
                  title=f"B / A   (A = {a}, B = {b})")
    for c in changes:
        table.add_row(c.method, c.scope, f"{_num(c.a['tokens_per_s'])} → {_num(c.b['tokens_per_s'])}",
                      _num(c.ratio["tokens_per_s"]), f"{_num(c.a['speedup'])} → {_num(c.b['speedup'])}",
                      _num(c.ratio["speedup"]), f"{_num(c.a['mean_accepted'])} → {_num(c.b['mean_accepted'])}",
                      f"{_num(c.mismatches[0])} → {_num(c.mismatches[1])}")
    Console().print(table)
    for name in only_a:
        err.print(f"only in A: {name}")
    for name in only_b:
        err.print(f"only in B: {name}")
    for line in differences:
        err.print(f"[yellow]settings differ[/] {line}")
    for line in unlike:
        err.print(f"[yellow]not like-for-like[/] {line}")
