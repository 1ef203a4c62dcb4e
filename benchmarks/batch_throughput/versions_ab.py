"""Two versions of draftwise side by side: the same methods, prompts and batch sizes, each version
a long-lived process, the versions alternating group by group.

Each version's process loads the target once and opens every method's decoder (warming each up on
one prompt: any first-use measurement happens there).  Then, per pass, method and B, the workload's
prompts go in groups of B: each group is decoded by one version and then by the other (which goes
first alternates by group and by pass), at B = 1 through the public `Decoder.generate` (a request
alone) and at B > 1 through `Decoder.generate_many(max_batch=B)` (one closed batch).  A group takes
a second or so, so the two versions' timings of it are seconds apart and a machine's drift reaches
both.  Per method and B: tok/s of each version over the workload (median of the passes, range),
the new / base ratio per pass (median, range), and whether the outputs agree.  Writes summary.json
and report.md.

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
    """One version's process (its sources first on the path): loads, opens the methods' decoders,
    says "ready", then answers one JSON line per request line: {"method", "batch", "prompts": [i]}
    -> {"tokens", "seconds", "outputs"}."""
    from importlib import import_module

    from draftwise.api import open_decoder
    from draftwise.parse import spec_from_options
    from draftwise.spec import DecoderSpec
    from draftwise.workloads import first_turn_prompts

    try:
        from draftwise.runtime.round import GenerationConfig
    except ImportError:  # the base version's module path
        GenerationConfig = import_module("draftwise.engine").GenerationConfig
    try:
        from draftwise.measure.load import load_backend
    except ImportError:  # a base version from before measure/
        load_backend = import_module("draftwise.backends.load").load_backend
    target = load_backend(args.target, args.backend, args.threads)
    base = DecoderSpec(target=args.target, backend=args.backend, threads=args.threads,
                       generation=GenerationConfig(max_new_tokens=args.max_new))
    prompts = [list(p) for p in first_turn_prompts(target.chat_prompt, args.workload)]
    decoders = {}
    for method in args.methods.split(","):
        options = {**METHODS[method], **(LLAMACPP_LOOKUP if args.backend == "llamacpp" and method != "plain" else {})}
        decoders[method] = open_decoder(spec_from_options(options, base), loader=lambda *_: target)
        decoders[method].generate(prompts[0])  # warm-up (and any first-use measurement)
    print(json.dumps({"ready": len(prompts)}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        decoder, group = decoders[ask["method"]], [prompts[i] for i in ask["prompts"]]
        start = time.perf_counter()
        if ask["batch"] == 1:
            results = [decoder.generate(p) for p in group]
        else:
            results = decoder.generate_many(group, max_batch=ask["batch"])
        seconds = time.perf_counter() - start
        done = [r for r in results if not isinstance(r, BaseException)]
        outputs = [list(r.tokens) if not isinstance(r, BaseException) else [] for r in results]
        print(json.dumps({"tokens": sum(len(o) for o in outputs), "seconds": seconds, "outputs": outputs,
                          "rounds": sum(r.stats.rounds for r in done),
                          "drafted": sum(sum(r.from_draft) for r in done)}), flush=True)


class Version:
    """A worker process running one checkout."""

    def __init__(self, checkout: Path, args: argparse.Namespace) -> None:
        env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
        command = [sys.executable, __file__, "--worker", "--backend", args.backend, "--target", args.target,
                   "--workload", args.workload, "--methods", args.methods, "--max-new", str(args.max_new),
                   "--threads", str(args.threads), "--out", str(args.out)]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.prompts = int(self._read()["ready"])

    def _read(self) -> dict:
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the worker stopped (exit {self.process.wait()})")
            if line.startswith("{"):
                answer: dict = json.loads(line)
                return answer

    def ask(self, method: str, batch: int, prompts: list[int]) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"method": method, "batch": batch, "prompts": prompts}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


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
    workers = {name: Version(path, args) for name, path in versions.items()}
    n = workers["base"].prompts
    passes: list[dict] = []
    for repeat in range(args.repeats):
        cells = {name: [] for name in workers}
        for method in args.methods.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                totals = {name: {"method": method, "batch": batch, "tokens": 0, "seconds": 0.0, "rounds": 0,
                                 "drafted": 0, "outputs": []} for name in workers}
                for g, first in enumerate(range(0, n, batch)):
                    group = list(range(first, min(first + batch, n)))
                    order = ("base", "new") if (g + repeat) % 2 == 0 else ("new", "base")
                    for name in order:
                        answer = workers[name].ask(method, batch, group)
                        totals[name]["tokens"] += answer["tokens"]
                        totals[name]["seconds"] += answer["seconds"]
                        totals[name]["rounds"] += answer["rounds"]
                        totals[name]["drafted"] += answer["drafted"]
                        totals[name]["outputs"] += answer["outputs"]
                for name, cell in totals.items():
                    cell["tok_s"] = cell["tokens"] / cell["seconds"]
                    cells[name].append(cell)
        for name in workers:
            passes.append({"version": name, "repeat": repeat, "cells": cells[name]})
        print(f"pass {repeat}: " + ", ".join(
            f"{c['method']} B={c['batch']} {c['tok_s']:.2f}/{d['tok_s']:.2f}" for c, d in zip(cells["base"], cells["new"])),
            flush=True)
    for w in workers.values():
        w.close()
    rows, lines = [], [f"# Versions A/B ({args.target}, {args.backend}, {args.workload} first turns, {args.max_new} new "
                       f"tokens, {args.threads} threads, {args.repeats} passes, versions alternating by group of B prompts)", "",
                       f"base: {versions['base']}; new: {versions['new']}", "",
                       "| method | B | base tok/s (median, range) | new tok/s (median, range) | new / base per pass "
                       "(median, range) | outputs the same (per pass) | rounds base / new (drafted tokens) |",
                       "|---|---|---|---|---|---|---|"]
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

            rounds = " / ".join(f"{sum(c['rounds'] for c in cells) // len(cells)} ({sum(c['drafted'] for c in cells) // len(cells)})"
                                for cells in (base, new))
            lines.append(f"| {method} | {batch} | {spread(row['base'])} | {spread(row['new'])} | "
                         f"{spread(ratios, 3)} | {same} of {row['prompts']} | {rounds} |")
    for p in passes:
        for c in p["cells"]:
            c.pop("outputs")
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "rows": rows, "passes": passes}, indent=1))
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
