"""Two versions of draftwise side by side: the same methods, prompts and batch sizes, each pass a
fresh process per version, the versions interleaved (the one that goes first alternating).

Each process loads the target once, warms up on one prompt, then decodes the first turn of every
question of the workload with each method: at B = 1 through the public `Decoder.generate` (a
request alone) and at every B > 1 through `Decoder.generate_many(max_batch=B)` (a closed batch).
Per method and B: tok/s of each version (median of the passes, range), the new / base ratio per
pass (median, range), and whether the outputs agree.  Writes results.json and report.md.

    .venv/bin/python benchmarks/batch_throughput/versions_ab.py --base /path/to/base/checkout \\
        --new . --backend transformers --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

METHODS = {
    "plain": {"proposer": "none"},
    "lookup-gate": {"proposer": "prompt-lookup", "gate": "auto", "batch": "8"},
}
LLAMACPP_LOOKUP = {"lookup": "10", "ngram": "2", "candidates": "1"}


def worker(args: argparse.Namespace) -> None:
    """One version's pass (run with that version's sources first on the path): JSON on stdout."""
    from importlib import import_module

    from draftwise.api import open_decoder
    from draftwise.parse import spec_from_options
    from draftwise.spec import DecoderSpec
    from draftwise.workloads import first_turn_prompts

    try:
        from draftwise.runtime.round import GenerationConfig
    except ImportError:  # the base version's module path
        GenerationConfig = import_module("draftwise.engine").GenerationConfig  # the base version's module path
    try:
        from draftwise.measure.load import load_backend
    except ImportError:  # a base version from before measure/
        load_backend = import_module("draftwise.backends.load").load_backend
    target = load_backend(args.target, args.backend, args.threads)
    base = DecoderSpec(target=args.target, backend=args.backend, threads=args.threads,
                       generation=GenerationConfig(max_new_tokens=args.max_new))
    prompts = first_turn_prompts(target.chat_prompt, args.workload)
    cells = []
    for method in args.methods.split(","):
        options = {**METHODS[method], **(LLAMACPP_LOOKUP if args.backend == "llamacpp" and method != "plain" else {})}
        decoder = open_decoder(spec_from_options(options, base), loader=lambda *_: target)
        decoder.generate(list(prompts[0]))  # warm-up (and any first-use measurement)
        for batch in (int(b) for b in args.batches.split(",")):
            start = time.perf_counter()
            if batch == 1:
                outputs = [list(decoder.generate(list(p)).tokens) for p in prompts]
            else:
                results = decoder.generate_many([list(p) for p in prompts], max_batch=batch)
                outputs = [list(r.tokens) if not isinstance(r, BaseException) else [] for r in results]
            seconds = time.perf_counter() - start
            tokens = sum(len(o) for o in outputs)
            cells.append({"method": method, "batch": batch, "tokens": tokens, "seconds": seconds,
                          "tok_s": tokens / seconds, "outputs": outputs})
    print(json.dumps(cells))


def run_pass(checkout: Path, args: argparse.Namespace) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    command = [sys.executable, __file__, "--worker", "--backend", args.backend, "--target", args.target,
               "--workload", args.workload, "--methods", args.methods, "--batches", args.batches,
               "--max-new", str(args.max_new), "--threads", str(args.threads), "--out", str(args.out)]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    cells: list[dict] = json.loads(done.stdout.strip().splitlines()[-1])
    return cells


def spread(values: list[float], digits: int = 2) -> str:
    """median (min-max) of sorted values"""
    return f"{values[len(values) // 2]:.{digits}f} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="checkout of the base version")
    ap.add_argument("--new", type=Path, default=Path("."), help="checkout of the new version")
    ap.add_argument("--backend", default="transformers", choices=("transformers", "llamacpp"))
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="humaneval:0-15")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    versions = {"base": args.base.resolve(), "new": args.new.resolve()}
    passes: list[dict] = []
    for repeat in range(args.repeats):
        for name in (("base", "new") if repeat % 2 == 0 else ("new", "base")):
            cells = run_pass(versions[name], args)
            passes.append({"version": name, "repeat": repeat, "cells": cells})
            print(f"pass {repeat} {name}: " + ", ".join(f"{c['method']} B={c['batch']} {c['tok_s']:.2f}" for c in cells),
                  flush=True)
    rows, lines = [], [f"# Versions A/B ({args.target}, {args.backend}, {args.workload} first turns, {args.max_new} new "
                       f"tokens, {args.threads} threads, {args.repeats} interleaved passes)", "",
                       f"base: {versions['base']}; new: {versions['new']}", "",
                       "| method | B | base tok/s (median, range) | new tok/s (median, range) | new / base per pass "
                       "(median, range) | outputs the same (per pass) |", "|---|---|---|---|---|---|"]
    for method in args.methods.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            base, new = ([c for p in passes if p["version"] == version for c in p["cells"]
                          if c["method"] == method and c["batch"] == batch] for version in ("base", "new"))
            ratios = sorted(n["tok_s"] / b["tok_s"] for b, n in zip(base, new))
            same = [sum(x == y for x, y in zip(b["outputs"], n["outputs"])) for b, n in zip(base, new)]
            row = {"method": method, "batch": batch, "base": sorted(c["tok_s"] for c in base),
                   "new": sorted(c["tok_s"] for c in new), "ratio": ratios, "same": same,
                   "prompts": len(base[0]["outputs"])}
            rows.append(row)

            lines.append(f"| {method} | {batch} | {spread(row['base'])} | {spread(row['new'])} | "
                         f"{spread(ratios, 3)} | {same} of {row['prompts']} |")
    for p in passes:
        for c in p["cells"]:
            c.pop("outputs")
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "rows": rows, "passes": passes}, indent=1))
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
