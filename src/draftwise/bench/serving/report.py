"""From results.json to summary.json (rows of `summary.py`), report.md and the plots."""

from __future__ import annotations

from typing import Any

import json
from dataclasses import asdict
from pathlib import Path

from draftwise.bench.serving.loadgen import CLOSED
from draftwise.bench.serving.plots import write_plots
from draftwise.bench.serving.settings import REFERENCE_SERVER
from draftwise.bench.serving.summary import Row, summarize

BASELINES = (REFERENCE_SERVER, "llamacpp-server")  # ratio columns, where the run has them


def write_report(out: Path, results: dict[str, Any]) -> dict[str, Any]:
    rows = summarize(results)
    summary = {"settings": results["settings"], "environment": results["environment"],
               "rows": [asdict(r) for r in rows]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plots = write_plots(out, results, rows)
    (out / "report.md").write_text(markdown(results, rows, plots))
    return summary


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _baseline(row: Row, rows: list[Row], server: str) -> Row | None:
    return next((r for r in rows if (r.server, r.mode, r.value) == (server, row.mode, row.value)), None)


def _ratio(mine: float | None, theirs: float | None) -> str:
    return "-" if not mine or not theirs else f"{mine / theirs:.3f}"


def _load_label(row: Row) -> str:
    return f"c={int(row.value)}" if row.mode == CLOSED else f"{row.value:g} req/s"


def table(rows: list[Row]) -> list[str]:
    baselines = [b for b in BASELINES if any(r.server == b for r in rows)]
    head = (["load", "server", "output tok/s (min-max)"] + [f"x {b}" for b in baselines]
            + ["req/s", "TTFT p50/p90/p99 ms"] + ([f"TTFT p50 x {REFERENCE_SERVER}"] if REFERENCE_SERVER in baselines
                                                 else [])
            + ["TPOT p50/p90/p99 ms", "ITL p50/p90/p99 ms", "E2EL p50 ms", "failed", f"text != {REFERENCE_SERVER} "
               "(same load / first load)", "machine load"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sorted(rows, key=lambda r: (r.mode != CLOSED, r.value)):
        cells = [_load_label(row), row.server,
                 f"{row.output_tok_s:.2f} ({row.output_tok_s_min:.2f}-{row.output_tok_s_max:.2f})"]
        bases = {b: _baseline(row, rows, b) for b in baselines}
        cells += [_ratio(row.output_tok_s, None if base is None else base.output_tok_s) for base in bases.values()]
        cells += [f"{row.request_s:.3f}", " / ".join(_num(v) for v in row.ttft_ms)]
        if REFERENCE_SERVER in bases:
            reference = bases[REFERENCE_SERVER]
            cells.append(_ratio(row.ttft_ms[0], None if reference is None else reference.ttft_ms[0]))
        exact = f"{row.same_load or '-'} / {row.first_load or '-'}"
        cells += [" / ".join(_num(v) for v in row.tpot_ms), " / ".join(_num(v) for v in row.itl_ms),
                  _num(row.e2el_ms_p50, ".0f"), str(row.failed), exact, _num(row.load_avg_1m)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


DEFINITIONS = """Definitions (vLLM's `benchmark_serving` conventions, client clock): output tok/s = completed requests'
completion tokens / cell duration (first send to last end); TTFT = first chunk with text - send; TPOT =
(E2EL - TTFT) / (tokens - 1), requests of 2+ tokens; ITL = gaps between successive chunks with text, pooled (a
chunk may hold several tokens: compare servers by TPOT); E2EL = last chunk - send; percentiles by linear
interpolation (numpy).  Figures are medians over repeats.  Machine load: the 1-minute load average as
the cell ended (the server under test included; above the server's threads, other work shared the cores).  Tokens are the server's usage counts; a server that
reports none (llama_cpp.server streams no usage) is counted one token per text chunk."""


def markdown(results: dict[str, Any], rows: list[Row], plots: list[Path]) -> str:
    s, env = results["settings"], results["environment"]
    servers = {c["server"]: f"{c['kind']} {' '.join(c['args'])}".strip() for c in results["cells"]}
    counted = sorted({r.server for r in rows if r.tokens_counted})
    lines = [f"# Serving benchmark: {s['target']}", "",
             f"{s['num_prompts']} prompts of `{s['workload']}` (first turns, /v1/{s['endpoint']}), {s['max_tokens']} "
             f"max tokens, temperature {s['temperature']}, seed {s['seed']}, draftwise backend {s['backend']}, "
             f"{env['threads']} thread(s) per server, servers one at a time, {s['repeats']} repeat(s).", "",
             "Servers: " + "; ".join(f"`{n}` = {d}" for n, d in servers.items()) + ".", "",
             *table(rows), "", DEFINITIONS, ""]
    if counted:
        lines += [f"Counted per chunk (no usage reported): {', '.join(counted)}.", ""]
    if s["temperature"] != 0:
        lines += ["Texts not compared: temperature > 0.", ""]
    machine = env["machine"]
    lines += [f"Machine: {machine['cpu']} ({machine['cpus_usable']} usable CPUs), Python {machine['python']}; "
              + ", ".join(f"{k} {v}" for k, v in env["libraries"].items() if v) + ".", ""]
    source = results.get("source") or {}
    if source.get("commit"):
        changed = source.get("changed") or []
        lines += [f"Source: commit {source['commit'][:12]}" + (f", with {len(changed)} changed file(s) under "
                  f"src/draftwise: {', '.join(c.split()[-1] for c in changed)}" if changed else "") + ".", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"
