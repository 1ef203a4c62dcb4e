"""Batched drafting (issue 43 item 2): a draft model's steps for every request of a round in ONE
forward, against drafting request by request, at B = 1, 2, 4, 8.

Both modes decode the same prompts in shared rounds (`Engine`, closed loop: the next
request joins as one finishes) with the same target batch and the same draft weights; they
differ only in how each round's draft steps run:

- `batched`: `draftwise.build.batch_decoder` (the draft model as a `TransformersBatch`, one slot
  per request; each draft step is one `draft_many` forward over every request that still drafts);
- `per-request`: each request drafts on a fork of the draft model (its own `DynamicCache`), one
  forward per request per step: what the batch engine did before.

Per cell: total committed tok/s across the batch, the per-round draft time (`SharedForward.drafting`:
the wall time of a round's draft steps before its shared verify; median over rounds and mean),
draft calls per round, and every request's greedy tokens (compared with each other and with
single-request decoding through today's engine: 0 mismatches expected at float32).  Repeats are
interleaved (B and mode rotated each repeat); before each cell the script waits while
/tmp/draftwise_quiet exists (another session's timed run), and a cell during which a supervisor
paused the process (it bumps the mtime of $DRAFTING_PAUSE_MARK when it does) is measured again.

    PYTHONPATH=src .venv/bin/python benchmarks/batch_throughput/drafting.py \\
        --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --workload humaneval:0-7 \\
        --batches 1,2,4,8 --max-new 32 --k 4 --repeats 2 --threads 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from draftwise.backends.load import open_batch
from draftwise.measure.load import load_backend
from draftwise.runtime.engine import Engine
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.parse import spec_from_options
from draftwise.spec import DecoderSpec
from draftwise.workloads import first_turn_prompts

QUIET = Path("/tmp/draftwise_quiet")
PAUSE_MARK = Path(os.environ.get("DRAFTING_PAUSE_MARK", "/nonexistent"))
MODES = ("batched", "per-request")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--workload", default="humaneval:0-7")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="draft chain length")
    ap.add_argument("--tree", default=None, help="a draft tree instead of a chain (e.g. wbd:2,2,1)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def per_request_decoder(spec: DecoderSpec, target, draft, slots: int) -> Engine:
    """The batch engine with each request drafting on a fork of the draft model: one forward per
    request per draft step (a `DraftRequest` of its own each)."""

    def decoder_for(slot, config: GenerationConfig):
        generation = replace(spec.generation, max_new_tokens=config.max_new_tokens, policy=config.policy,
                             seed=config.seed, stop_strings=config.stop_strings)
        return build_decoder(replace(spec, generation=generation), slot, draft.fork())

    return Engine(open_batch(target, slots), decoder_for, spec.generation)


def run_cell(engine: Engine, prompts: list[list[int]]) -> dict:
    start = time.perf_counter()
    results = engine.generate_many(prompts)
    wall = time.perf_counter() - start
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"requests failed: {failed}")
    drafting = [r.drafting for r in engine.forwards if r.draft_calls]
    tokens = sum(len(r.tokens) for r in results)
    return {"wall": wall, "tokens": tokens, "tok_s": tokens / wall, "rounds": len(engine.forwards),
            "draft_median_ms": 1e3 * statistics.median(drafting) if drafting else 0.0,
            "draft_mean_ms": 1e3 * statistics.fmean(drafting) if drafting else 0.0,
            "draft_share": sum(drafting) / wall,
            "draft_calls_per_round": statistics.fmean(r.draft_calls for r in engine.forwards),
            "mean_accepted": statistics.fmean(r.stats.mean_accepted for r in results),
            "outputs": [list(r.tokens) for r in results]}


def wait_quiet() -> None:
    while QUIET.exists():
        time.sleep(60)


def summarize(cells: list[dict], batches: list[int]) -> list[dict]:
    rows = []
    for b in batches:
        for mode in MODES:
            mine = [c for c in cells if c["batch"] == b and c["mode"] == mode]
            row = {"batch": b, "mode": mode, "repeats": len(mine)}
            for key in ("tok_s", "draft_median_ms", "draft_mean_ms", "draft_share", "draft_calls_per_round"):
                values = [c[key] for c in mine]
                row[key] = statistics.median(values)
                row[key + "_spread"] = [min(values), max(values)]
            rows.append(row)
    return rows


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    target = load_backend(args.target, "transformers", args.threads)
    draft = load_backend(args.draft, "transformers", args.threads)
    torch.set_num_threads(args.threads)
    options = {"proposer": "draft-model", "guard": "false", "k": str(args.k)}
    if args.tree:
        options["tree"] = args.tree
    spec = spec_from_options(options, DecoderSpec(target=args.target, draft=args.draft, backend="transformers",
                                                  generation=GenerationConfig(max_new_tokens=args.max_new)))
    prompts = first_turn_prompts(target.chat_prompt, args.workload)
    wait_quiet()
    start = time.perf_counter()
    solo = [list(build_decoder(spec, target, draft).generate(p).tokens) for p in prompts]
    solo_tok_s = sum(map(len, solo)) / (time.perf_counter() - start)
    print(f"solo (today's single-request engine): {solo_tok_s:.2f} tok/s", flush=True)
    cells: list[dict] = []
    for repeat in range(args.repeats):
        order = [(b, m) for b in batches for m in MODES]
        order = order[repeat % len(order):] + order[: repeat % len(order)]  # rotated: interleaved repeats
        if repeat % 2:
            order = order[::-1]
        for b, mode in order:
            while True:
                wait_quiet()
                engine = batch_decoder(spec, open_batch(target, b), draft) if mode == "batched" else \
                    per_request_decoder(spec, target, draft, b)
                began = time.time()
                cell = {"batch": b, "mode": mode, "repeat": repeat, **run_cell(engine, prompts)}
                if not (PAUSE_MARK.exists() and PAUSE_MARK.stat().st_mtime >= began):
                    break
                print(f"B={b} {mode}: paused during the cell, measured again", flush=True)
            cell["mismatches"] = sum(o != s for o, s in zip(cell["outputs"], solo))
            cells.append(cell)
            print(f"B={b} {mode:11s} r{repeat}: {cell['tok_s']:.2f} tok/s, draft {cell['draft_median_ms']:.1f} ms/round "
                  f"(median; {cell['draft_calls_per_round']:.2f} calls/round), {cell['mismatches']} mismatches",
                  flush=True)
            (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                               "machine": platform.processor() or platform.machine(),
                                                               "solo_tok_s": solo_tok_s, "cells": cells}, indent=1))
    summary = summarize(cells, batches)
    (args.out / "summary.json").write_text(json.dumps({"solo_tok_s": solo_tok_s, "rows": summary}, indent=1))
    for row in summary:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))


if __name__ == "__main__":
    main(sys.argv[1:])
