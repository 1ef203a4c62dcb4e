"""Verify forwards padded to the row count measured fastest (`measure/row_padding.py`) against
the same decoders unpadded, side by side on one loaded model (transformers, float32).

Each method decodes the first turn of every question of the workload with padding on and off
(the same loaded target, its `row_padding` set or cleared between runs, which a batch opened on
it takes for its one-sequence forwards; each arm's gate profile is its own, as the gate caches
key on the padding), interleaved by question, the arm that goes
first alternating; `--repeats` passes.  Per method and arm: tok/s over the workload (median of
the passes, range), the ratio on/off per pass, and every output compared with plain decoding's
(token identity at temperature 0).  Writes results.json and report.md.

    PYTHONPATH=src .venv/bin/python benchmarks/row_padding/ab.py \\
        --out "$(bash benchmarks/peers/run_dir.sh row_padding ab)"
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from draftwise.api import open_decoder
from draftwise.measure.load import load_backend
from draftwise.measure.profile import machine_description
from draftwise.bench.study import read_noise, write_study
from draftwise.runtime.round import GenerationConfig
from draftwise.parse import spec_from_options
from draftwise.spec import DecoderSpec
from draftwise.timing import Spread
from draftwise.workloads import first_turn_prompts

METHODS = {
    "plain": {"proposer": "none"},
    "lookup": {"proposer": "prompt-lookup", "guard": "false"},
    "lookup-gate": {"proposer": "prompt-lookup", "gate": "auto"},
    "lookup-gate-b4": {"proposer": "prompt-lookup", "gate": "auto", "batch": "4"},  # the batch-aware gate
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="humaneval:0-7")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=1,
                    help="B > 1: every method decodes the workload B requests at a time (closed loop, "
                         "`Decoder.batch(B).generate_many`), one cell per method and arm")
    ap.add_argument("--batch-engine", action="store_true",
                    help="decode through the batch engine even at --concurrency 1 (`Decoder.batch(1)`: its "
                         "one-sequence forwards pad by the model's plan), interleaved by question as alone")
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    target = load_backend(args.target, "transformers", args.threads)
    padding = target.row_padding
    assert padding is not None
    print(f"row padding here: {padding.describe()}", flush=True)
    prompts = first_turn_prompts(target.chat_prompt, args.workload)
    methods = args.methods.split(",")
    base = DecoderSpec(target=args.target, backend="transformers", threads=args.threads,
                       generation=GenerationConfig(max_new_tokens=args.max_new))
    decoders = {}
    for arm, plan in (("on", padding), ("off", None)):
        target.row_padding = plan
        for method in methods:  # planned with this arm's padding: its own gate profile and trees
            decoders[method, arm] = open_decoder(spec_from_options(METHODS[method], base),
                                                 loader=lambda *_: target)
    probe = prompts[0][:32]

    noise = {"start": read_noise(target, probe)}
    print(f"noise check at the start: {noise['start']}", flush=True)
    cells: list[dict] = []
    for repeat in range(args.repeats):
        totals = {(m, a): [0, 0.0] for m in methods for a in ("on", "off")}
        outputs: dict[tuple[str, str], list[list[int]]] = {key: [] for key in totals}
        # alone: interleaved by question; in batches: by method (a cell is the whole workload)
        for i, group in (enumerate([[p] for p in prompts]) if args.concurrency == 1 else [(0, prompts)]):
            for method in methods:
                for arm in (("on", "off") if (i + repeat) % 2 == 0 else ("off", "on")):
                    target.row_padding = padding if arm == "on" else None
                    decoder = decoders[method, arm]
                    start = time.perf_counter()
                    results = ([decoder.engine.generate(group[0])] if args.concurrency == 1 and not args.batch_engine
                               else decoder.batch(args.concurrency).generate_many(group))
                    totals[method, arm][1] += time.perf_counter() - start
                    for result in results:
                        if isinstance(result, BaseException):
                            raise result
                        totals[method, arm][0] += len(result.tokens)
                        outputs[method, arm].append(list(result.tokens))
        for (method, arm), (tokens, seconds) in totals.items():
            same = sum(o == p for o, p in zip(outputs[method, arm], outputs["plain", "off"])) if "plain" in methods else None
            cells.append({"method": method, "arm": arm, "repeat": repeat, "tokens": tokens, "seconds": seconds,
                          "tok_s": tokens / seconds, "same_as_plain": same, "prompts": len(prompts)})
            print(f"r{repeat} {method:12s} {arm:3s}: {tokens / seconds:6.2f} tok/s, {same}/{len(prompts)} plain's text",
                  flush=True)
    noise["end"] = read_noise(target, probe)
    print(f"noise check at the end: {noise['end']}", flush=True)
    rows = []
    for method in methods:
        mine = {arm: [c for c in cells if c["method"] == method and c["arm"] == arm] for arm in ("on", "off")}
        rows.append({"method": method, **{arm: Spread.of([c["tok_s"] for c in got]) for arm, got in mine.items()},
                     "on_over_off": Spread.of([on["tok_s"] / off["tok_s"] for on, off in zip(mine["on"], mine["off"])]),
                     "same_as_plain": [c["same_as_plain"] for c in cells if c["method"] == method]})
    plain_off = next((r["off"].median for r in rows if r["method"] == "plain"), None)
    batch = (f", {args.concurrency} requests in flight" if args.concurrency > 1 else
             ", one request at a time through the batch engine" if args.batch_engine else "")
    lines = [f"# Row padding on/off ({args.target}, transformers float32, {args.workload} first turns, "
             f"{args.max_new} new tokens, {args.threads} threads{batch}, {args.repeats} interleaved passes)", "",
             f"Machine: {machine_description()}.  Padding measured here: {padding.describe()}.",
             f"Noise check: start {noise['start']}; end {noise['end']}.", "",
             "| method | padded tok/s (range) | unpadded tok/s (range) | padded / unpadded per pass (median, range) "
             "| padded x plain unpadded | turns equal to plain's (per cell) |", "|---|---|---|---|---|---|"]
    for row in rows:
        versus = f"{row['on'].median / plain_off:.2f}x" if plain_off else "-"
        lines.append(f"| {row['method']} | {row['on'].cell(2)} | {row['off'].cell(2)} | {row['on_over_off'].cell(3)} "
                     f"| {versus} | {row['same_as_plain']} |")
    write_study(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_description(),
                           "padding": padding.as_dict(), "padding_described": padding.describe(), "noise": noise,
                           "cells": cells, "rows": rows}, lines)


if __name__ == "__main__":
    main(sys.argv[1:])
