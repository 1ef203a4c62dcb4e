"""Self-drafters' draft steps for B requests: one composed forward per step (`LayerSkipBatch`,
what a batch runs now) against one composed pass per request per step (what it ran before).

Each of B requests first reads its own first-turn chat prompt on its draft pass, then one round of
k chain draft steps (one token each) is timed: batched = k `draft_many` calls over every request;
per-request = k x B single-pass extends.  The passes are the proposers' own (`make_proposers`
with the family's defaults; Kangaroo with `reuse=false`, as in a batch).  Interleaved repeats
(the order of B and mode rotated per repeat); the logits of the last step are compared between
the modes (max |difference|, argmax agreement).  Writes results.json and report.md.

    PYTHONPATH=src .venv/bin/python benchmarks/batch_throughput/self_draft_steps.py \\
        --proposer kangaroo --batches 1,2,4,8 --repeats 3 \\
        --out "$(bash benchmarks/peers/run_dir.sh batch_throughput self-draft-steps)"
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from draftwise.backends.batch import Extend
from draftwise.backends.layer_skip_batch import LayerSkipBatch
from draftwise.measure.load import load_backend
from draftwise.bench.study import write_study
from draftwise.build import make_proposers
from draftwise.runtime.round import GenerationConfig
from draftwise.parse import spec_from_options
from draftwise.spec import DecoderSpec
from draftwise.timing import Spread, noise_check
from draftwise.workloads import first_turn_prompts

SKIP_SET = "benchmarks/self_speculation/skip_sets/skip-smollm2-135m"
MODES = ("batched", "per-request")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--proposer", default="kangaroo", choices=("kangaroo", "layer-skip"))
    ap.add_argument("--skip", default=SKIP_SET, help="layer-skip: the skip set")
    ap.add_argument("--workload", default="humaneval:0-7")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--k", type=int, default=4, help="draft steps per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def passes(args: argparse.Namespace, target, count: int) -> list:
    """`count` draft passes of their own (each its own cache), as the proposer opens them alone."""
    options = {"proposer": args.proposer, "guard": "false"}
    options.update({"reuse": "false"} if args.proposer == "kangaroo" else {"skip": args.skip})
    spec = spec_from_options(options, DecoderSpec(target=args.target, backend="transformers",
                                                  generation=GenerationConfig(max_new_tokens=args.k)))
    return [make_proposers(spec, target)[0].draft for _ in range(count)]


def batched(draft, prompts: list[list[int]], k: int) -> tuple[float, torch.Tensor]:
    batch = LayerSkipBatch(draft, len(prompts))
    slots = [batch.open() for _ in prompts]
    batch.draft_many([Extend(s, tuple(p)) for s, p in zip(slots, prompts)])
    start = time.perf_counter()
    for step in range(k):
        out = batch.draft_many([Extend(s, (13 + step,)) for s in slots])
    seconds = time.perf_counter() - start
    return seconds, torch.stack([o.logits[-1].float() for o in out])  # [B, V]


def per_request(drafts: list, prompts: list[list[int]], k: int) -> tuple[float, torch.Tensor]:
    for draft, prompt in zip(drafts, prompts):
        draft.reset()
        draft.extend(prompt)
    start = time.perf_counter()
    for step in range(k):
        out = [draft.extend([13 + step]) for draft in drafts]
    seconds = time.perf_counter() - start
    return seconds, torch.stack([o.logits[-1].float() for o in out])


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    target = load_backend(args.target, "transformers", args.threads)
    prompts = first_turn_prompts(target.chat_prompt, args.workload)
    drafts = passes(args, target, max(batches))
    probe = torch.tensor([prompts[0][:32]])

    def step() -> None:  # a fixed forward of the target, repeated: how steady the machine is
        with torch.inference_mode():
            target.model(probe)

    noise = {"start": noise_check(step).describe()}
    print(f"noise check at the start: {noise['start']}", flush=True)
    cells: list[dict] = []
    order = [(b, m) for b in batches for m in MODES]
    for repeat in range(args.repeats):
        rotated = order[repeat % len(order):] + order[: repeat % len(order)]
        for b, mode in rotated[:: -1 if repeat % 2 else 1]:
            mine = [prompts[i % len(prompts)] for i in range(b)]
            seconds, last = (batched(drafts[0], mine, args.k) if mode == "batched"
                             else per_request(drafts[:b], mine, args.k))
            cells.append({"batch": b, "mode": mode, "repeat": repeat, "ms": 1e3 * seconds,
                          "last_argmax": last.argmax(-1).tolist(), "last_logits": last})
            print(f"B={b} {mode:11s} r{repeat}: {1e3 * seconds:7.1f} ms for {args.k} steps", flush=True)
    noise["end"] = noise_check(step).describe()
    print(f"noise check at the end: {noise['end']}", flush=True)
    rows = []
    for b in batches:
        row: dict = {"batch": b}
        for mode in MODES:
            row[mode] = Spread.of([c["ms"] for c in cells if c["batch"] == b and c["mode"] == mode])
        pair = [next(c for c in cells if c["batch"] == b and c["mode"] == m) for m in MODES]
        row["max_abs_logit_diff"] = float((pair[0]["last_logits"] - pair[1]["last_logits"]).abs().max())
        row["argmax_equal"] = pair[0]["last_argmax"] == pair[1]["last_argmax"]
        row["per_request_over_batched"] = row["per-request"].median / row["batched"].median
        rows.append(row)
    for cell in cells:
        del cell["last_logits"]
    lines = [f"# {args.proposer}: {args.k} draft steps for B requests ({args.target}, {args.threads} threads)", "",
             f"Noise check: start {noise['start']}; end {noise['end']}.", "",
             "| B | batched ms (range) | per-request ms (range) | per-request / batched | last step: max abs logit diff, "
             "argmax equal |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['batch']} | {row['batched'].cell(1)} | {row['per-request'].cell(1)} | "
                     f"{row['per_request_over_batched']:.2f}x | {row['max_abs_logit_diff']:.2e}, {row['argmax_equal']} |")
    write_study(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                           "machine": platform.processor() or platform.machine(), "noise": noise, "cells": cells,
                           "rows": rows}, lines)


if __name__ == "__main__":
    main(sys.argv[1:])
