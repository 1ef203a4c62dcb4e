"""B = 1: the batch engine (`Decoder.batch(1)`, what `--concurrency 1` and `draftwise serve` run)
against the single-request engine (`Decoder.engine`), the same method on one loaded target.

Each method decodes the first turn of every question through both engines, interleaved by
question (the engine that goes first alternating); the batch engine is one `Engine` for
the whole pass, as in a bench cell, so its guard carries from request to request as the single
engine's does.  Per method and engine: tok/s over the workload (median of the passes, range),
the batch / single ratio per pass, rounds per pass, and whether every output is the same.
Writes results.json and report.md.

    PYTHONPATH=src .venv/bin/python benchmarks/batch_throughput/b1_engines.py --backend transformers \\
        --out "$(bash benchmarks/peers/run_dir.sh batch_throughput b1-engines)"
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from draftwise.api import open_decoder
from draftwise.measure.load import load_backend
from draftwise.measure.profile import machine_description
from draftwise.bench.study import read_noise, write_study
from draftwise.runtime.round import GenerationConfig
from draftwise.parse import spec_from_options
from draftwise.spec import DecoderSpec
from draftwise.timing import Spread
from draftwise.workloads import first_turn_prompts

# the concurrency study's methods (concurrency.sh): llama.cpp's lookup as its gate was tuned
METHODS = {
    "plain": {"proposer": "none"},
    "lookup-gate": {"proposer": "prompt-lookup", "gate": "auto", "batch": "8"},
}
LLAMACPP_LOOKUP = {"lookup": "10", "ngram": "2", "candidates": "1"}
ENGINES = ("single", "batch")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="transformers", choices=("transformers", "llamacpp"))
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="humaneval:0-15")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    methods = args.methods.split(",")
    target = load_backend(args.target, args.backend, args.threads)  # every method on the same loaded weights
    base = DecoderSpec(target=args.target, backend=args.backend, threads=args.threads,
                       generation=GenerationConfig(max_new_tokens=args.max_new))
    decoders = {}
    for method in methods:
        options = {**METHODS[method], **(LLAMACPP_LOOKUP if args.backend == "llamacpp" and method != "plain" else {})}
        decoders[method] = open_decoder(spec_from_options(options, base), loader=lambda *_: target)
    prompts = first_turn_prompts(target.chat_prompt, args.workload)
    probe = prompts[0][:32]

    noise = {"start": read_noise(target, probe)}
    print(f"noise check at the start: {noise['start']}", flush=True)
    cells = []
    for repeat in range(args.repeats):
        for method in methods:
            decoder = decoders[method]
            config = decoder.spec.generation
            batch = decoder.batch(1)
            totals = {engine: {"tokens": 0, "seconds": 0.0, "rounds": 0, "outputs": []} for engine in ENGINES}
            for i, prompt in enumerate(prompts):
                for engine in (ENGINES if (i + repeat) % 2 == 0 else ENGINES[::-1]):
                    start = time.perf_counter()
                    if engine == "single":
                        result = decoder.engine.generate(list(prompt))
                        rounds = len(result.records)
                    else:
                        before = len(batch.forwards)
                        [result] = batch.generate_many([list(prompt)], [config])
                        if isinstance(result, BaseException):
                            raise result
                        rounds = len(batch.forwards) - before
                    cell = totals[engine]
                    cell["seconds"] += time.perf_counter() - start
                    cell["tokens"] += len(result.tokens)
                    cell["rounds"] += rounds
                    cell["outputs"].append(list(result.tokens))
            same = sum(a == b for a, b in zip(totals["single"]["outputs"], totals["batch"]["outputs"]))
            for engine, cell in totals.items():
                cells.append({"method": method, "engine": engine, "repeat": repeat, "tokens": cell["tokens"],
                              "seconds": cell["seconds"], "tok_s": cell["tokens"] / cell["seconds"],
                              "rounds": cell["rounds"], "same_as_other": same, "prompts": len(prompts)})
            print(f"r{repeat} {method:12s} single {cells[-2]['tok_s']:6.2f} tok/s ({cells[-2]['rounds']} rounds), "
                  f"batch {cells[-1]['tok_s']:6.2f} ({cells[-1]['rounds']} rounds), {same}/{len(prompts)} the same",
                  flush=True)
    noise["end"] = read_noise(target, probe)
    print(f"noise check at the end: {noise['end']}", flush=True)
    rows = []
    for method in methods:
        mine = {engine: [c for c in cells if c["method"] == method and c["engine"] == engine] for engine in ENGINES}
        rows.append({"method": method, **{engine: Spread.of([c["tok_s"] for c in got]) for engine, got in mine.items()},
                     "batch_over_single": Spread.of([b["tok_s"] / s["tok_s"] for s, b in zip(mine["single"], mine["batch"])]),
                     "rounds": {engine: [c["rounds"] for c in got] for engine, got in mine.items()},
                     "same": [c["same_as_other"] for c in mine["batch"]]})
    lines = [f"# B = 1: the batch engine against the single-request engine ({args.target}, {args.backend}, "
             f"{args.workload} first turns, {args.max_new} new tokens, {args.threads} threads, {args.repeats} "
             "interleaved passes)", "",
             f"Machine: {machine_description()}.  Noise check: start {noise['start']}; end {noise['end']}.", "",
             "| method | single tok/s (range) | batch engine tok/s (range) | batch / single per pass (median, range) "
             "| rounds single / batch | outputs the same (per pass) |", "|---|---|---|---|---|---|"]
    for row in rows:
        rounds = f"{'/'.join(map(str, row['rounds']['single']))} / {'/'.join(map(str, row['rounds']['batch']))}"
        lines.append(f"| {row['method']} | {row['single'].cell()} | {row['batch'].cell()} | "
                     f"{row['batch_over_single'].cell(3)} | {rounds} | {row['same']} of {len(prompts)} |")
    write_study(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_description(),
                           "noise": noise, "cells": cells, "rows": rows}, lines)


if __name__ == "__main__":
    main()
