"""Throughput at batch 1, 2, 4, 8: plain batched decoding vs fixed speculation in shared rounds.

Closed loop: B requests in flight (`Decoder.batch(B)`), the next joining as one finishes, over
the same N first-turn prompts for every method and batch size.  Methods (each on the same loaded
target): `sequential` (today's single-request engine, one request after another, plain decoding:
the batch-1 reference), `plain` (proposer none, batched), `lookup` (prompt lookup at its
defaults, batched, `guard=false`: fixed-depth speculation, what a serving engine does by
default), `lookup+guard` (the same behind the batch's do-no-harm guard, which plays plain rounds
where they measure faster) and `lookup+gate` (prompt lookup behind `gate=auto` planned for
`batch=max(--batches)`, and the guard: the gate prices each round's rows by the measured t_B(n)
of the current batch size: the batch-aware policy; `--no-gate` leaves it out).  Repeats are interleaved (method order rotated each
repeat) and every figure is a median with its spread.  Per cell: total tok/s, per-request tok/s,
time to first token, inter-token latency p50/p90/p99 (a token that arrives in the same round as
the one before it has gap 0), peak KV bytes, peak RSS; greedy outputs are compared with the
`sequential` ones (0 mismatches expected on transformers float32).

    PYTHONPATH=src .venv/bin/python benchmarks/batch_throughput/run.py --backend transformers \\
        --workload humaneval:0-15 --batches 1,2,4,8 --max-new 64 --repeats 3 --out DIR [--resume]

Writes DIR/results.json (every cell; `--resume` skips the ones there), DIR/report.md and
DIR/throughput.png, DIR/itl_cdf.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from draftwise.api import open_decoder
from draftwise.runtime.engine import Finished, Tokens
from draftwise.runtime.round import GenerationConfig
from draftwise.spec import DecoderSpec
from draftwise.workloads import first_turn_prompts

# lookup: fixed depth, always speculating (guard=false), what a serving engine does by default;
# lookup+guard: the same behind the batch's do-no-harm guard (draftwise.runtime.guard)
METHODS = {"plain": {"proposer": "none"}, "lookup": {"proposer": "prompt-lookup", "guard": "false"},
           "lookup+guard": {"proposer": "prompt-lookup"}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="transformers")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="humaneval:0-15")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-gate", action="store_true", help="leave out lookup+gate (no profile measured)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--resume", action="store_true")
    return ap.parse_args(argv)


def run_batched(decoder, prompts: list[list[int]], batch: int) -> dict:
    engine = decoder.batch(batch)
    ids = [engine.submit(p) for p in prompts]
    submitted = time.perf_counter()
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    gaps: list[float] = []
    tokens: dict[int, tuple[int, ...]] = {}
    kv_peak = 0
    start = time.perf_counter()
    while not engine.idle():
        events = engine.step()
        now = time.perf_counter()
        kv_peak = max(kv_peak, engine.target.kv_bytes(None))
        for event in events:
            if isinstance(event, Tokens):
                if event.request not in first:
                    first[event.request] = now
                else:
                    gaps.append(now - last[event.request])
                gaps.extend([0.0] * (len(event.tokens) - 1))
                last[event.request] = now
            elif isinstance(event, Finished):
                tokens[event.request] = event.result.tokens
            else:
                raise RuntimeError(f"request {event.request} failed: {event.error}")
    wall = time.perf_counter() - start
    per_request = [len(tokens[i]) / (last[i] - submitted) for i in ids]
    return {"wall_s": wall, "new_tokens": sum(len(t) for t in tokens.values()),
            "request_tok_s": per_request, "ttft_s": [first[i] - submitted for i in ids], "itl_s": gaps,
            "kv_peak_bytes": kv_peak, "tokens": [list(tokens[i]) for i in ids],
            "shared_rounds": len(engine.rounds), "rows_per_forward": statistics.mean(sum(r.rows) for r in engine.rounds),
            # the round-cost ledger: time in the shared forwards vs everything else (proposing,
            # compiling, gating, selecting, committing, the Python between them)
            "forward_s": sum(r.seconds for r in engine.rounds)}


def run_sequential(decoder, prompts: list[list[int]]) -> dict:
    start = time.perf_counter()
    outs = [decoder.generate(p) for p in prompts]
    wall = time.perf_counter() - start
    return {"wall_s": wall, "new_tokens": sum(len(o.tokens) for o in outs),
            "request_tok_s": [o.stats.tokens_per_s for o in outs], "ttft_s": [], "itl_s": [],
            "kv_peak_bytes": max(decoder.target.kv_bytes(), 0), "tokens": [list(o.tokens) for o in outs],
            "shared_rounds": 0, "rows_per_forward": 0.0,
            "forward_s": sum((o.stats.time_split.get("verify", 0.0) + o.stats.time_split.get("prefill", 0.0))
                             * len(o.tokens) for o in outs)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("draftwise").setLevel(logging.INFO)  # the planner's measurements show progress
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    cells = json.loads(results_path.read_text())["cells"] if args.resume and results_path.is_file() else []
    done = {(c["method"], c["batch"], c["repeat"]) for c in cells}
    batches = [int(b) for b in args.batches.split(",")]
    spec = DecoderSpec(target=args.target, backend=args.backend, threads=args.threads,
                       generation=GenerationConfig(max_new_tokens=args.max_new))
    base = open_decoder(spec, proposer="none")
    methods = dict(METHODS)
    if not args.no_gate:
        methods["lookup+gate"] = {"proposer": "prompt-lookup", "gate": "auto", "batch": max(batches)}
    decoders = {name: open_decoder(spec, loader=lambda *_: base.target, **options) for name, options in methods.items()}
    prompts = first_turn_prompts(base.target.chat_prompt, args.workload)
    print(f"{len(prompts)} prompts, {args.max_new} new tokens, batches {batches}, {args.repeats} repeats", flush=True)
    names = ["sequential", *methods]
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]  # rotate: no method always first
        for batch in batches:
            for name in order:
                if name == "sequential" and batch != batches[0]:
                    continue  # one request at a time: the same at every batch size
                key = (name, 1 if name == "sequential" else batch, repeat)
                if key in done:
                    continue
                cell = (run_sequential(base, prompts) if name == "sequential"
                        else run_batched(decoders[name], prompts, batch))
                cell.update(method=name, batch=key[1], repeat=repeat,
                            rss_peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
                cells.append(cell)
                done.add(key)
                print(f"repeat {repeat} B={key[1]} {name}: {cell['new_tokens'] / cell['wall_s']:.2f} tok/s", flush=True)
                results_path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                    "prompts": len(prompts), "cells": cells}))
    write_report(args, cells, batches, list(methods))


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(cells: list[dict], batches: list[int], methods: list[str]) -> list[dict]:
    reference = [c for c in cells if c["method"] == "sequential"]
    ref_tokens = reference[0]["tokens"] if reference else None
    rows = []
    for name in ["sequential", *methods]:
        for batch in ([1] if name == "sequential" else batches):
            mine = [c for c in cells if c["method"] == name and c["batch"] == batch]
            if not mine:
                continue
            rates = [c["new_tokens"] / c["wall_s"] for c in mine]
            itl = [g for c in mine for g in c["itl_s"]]
            mismatches = 0 if ref_tokens is None else sum(t != r for t, r in zip(mine[0]["tokens"], ref_tokens))
            rows.append({"method": name, "batch": batch, "tok_s": _med(rates), "tok_s_min": min(rates),
                         "tok_s_max": max(rates), "request_tok_s": _med([_med(c["request_tok_s"]) for c in mine]),
                         "ttft_s": _med([_med(c["ttft_s"]) for c in mine]),
                         "itl_p50": float(np.percentile(itl, 50)) if itl else float("nan"),
                         "itl_p90": float(np.percentile(itl, 90)) if itl else float("nan"),
                         "itl_p99": float(np.percentile(itl, 99)) if itl else float("nan"),
                         "kv_peak_mb": max(c["kv_peak_bytes"] for c in mine) / 2**20,
                         "rss_peak_mb": max(c["rss_peak_bytes"] for c in mine) / 2**20,
                         "rows_per_forward": _med([c["rows_per_forward"] for c in mine]),
                         "forward_share": _med([c.get("forward_s", float("nan")) / c["wall_s"] for c in mine]),
                         "mismatches": mismatches, "repeats": len(mine)})
    return rows


def write_report(args: argparse.Namespace, cells: list[dict], batches: list[int], methods: list[str]) -> None:
    rows = summarize(cells, batches, methods)
    plain = {r["batch"]: r["tok_s"] for r in rows if r["method"] == "plain"}
    lines = [f"# Batch throughput: {args.target} on {args.backend}", "",
             f"{args.workload} first turns, {args.max_new} new tokens, greedy, closed loop (B in flight), "
             f"{args.repeats} interleaved repeats: medians (min-max).", "",
             "| method | B | total tok/s | x plain batched | per-request tok/s | TTFT s | ITL p50 / p90 / p99 ms "
             "| rows per forward | forward share of wall | KV peak MB | RSS peak MB | mismatches vs sequential |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["tok_s"] / plain[r["batch"]] if r["batch"] in plain else float("nan")
        lines.append(f"| {r['method']} | {r['batch']} | {r['tok_s']:.2f} ({r['tok_s_min']:.2f}-{r['tok_s_max']:.2f}) "
                     f"| {ratio:.3f} | {r['request_tok_s']:.2f} | {r['ttft_s']:.3f} | {r['itl_p50'] * 1e3:.1f} / "
                     f"{r['itl_p90'] * 1e3:.1f} / {r['itl_p99'] * 1e3:.1f} | {r['rows_per_forward']:.1f} "
                     f"| {r['forward_share']:.2f} "
                     f"| {r['kv_peak_mb']:.1f} | {r['rss_peak_mb']:.0f} | {r['mismatches']} |")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    plot(args.out, cells, rows, batches, methods)


def plot(out: Path, cells: list[dict], rows: list[dict], batches: list[int], methods: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in methods:
        mine = [r for r in rows if r["method"] == name]
        ax.errorbar([r["batch"] for r in mine], [r["tok_s"] for r in mine],
                    yerr=[[r["tok_s"] - r["tok_s_min"] for r in mine], [r["tok_s_max"] - r["tok_s"] for r in mine]],
                    marker="o", capsize=3, label=name)
    seq = [r for r in rows if r["method"] == "sequential"]
    if seq:
        ax.axhline(seq[0]["tok_s"], color="grey", linestyle=":", label="sequential (one at a time)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("requests in flight (B)")
    ax.set_ylabel("committed tokens / s (all requests)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    top = max(batches)
    for name in methods:
        itl = np.sort([g for c in cells if c["method"] == name and c["batch"] == top for g in c["itl_s"]])
        if itl.size:
            ax.plot(itl * 1e3, np.arange(1, itl.size + 1) / itl.size, label=name)
    ax.set_xlabel(f"inter-token latency, ms (B = {top})")
    ax.set_ylabel("fraction of tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "itl_cdf.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
