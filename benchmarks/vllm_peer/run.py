"""vLLM beside draftwise: the same prompts (token ids), the same model, greedy, at batch sizes B.

vLLM methods (`draftwise.vllm.methods` strings: vllm-plain, vllm-ngram:k=4, vllm-custom=prompt-lookup,
vllm-export=DIR, ...) run in .venv-vllm through `draftwise.vllm.runner`; draftwise methods
(dw-plain: proposer none, dw-lookup: prompt lookup at its defaults, batched with its guard) run
here through `draftwise.api.open_decoder` on the transformers backend in the same dtype.  The
prompts run in groups of B, each group one concurrent batch, in both engines.  Exactness: each
method's tokens against vLLM's plain decoding at the same B, and against draftwise's plain
decoding at B = 1 (same checkpoint and dtype, different kernels).

    PYTHONPATH=src .venv/bin/python benchmarks/vllm_peer/run.py --workload humaneval:0-7 \\
        --batches 1,8 --max-new 32 --out "$(bash benchmarks/peers/run_dir.sh vllm_peer)"
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from draftwise.api import open_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.spec import DecoderSpec
from draftwise.vllm.checkpoint import vllm_checkpoint
from draftwise.vllm.methods import parse_method
from draftwise.vllm.predict import accepted_prefix
from draftwise.vllm.protocol import WorkerRequest
from draftwise.vllm.runner import VllmEnvironment, run_worker
from draftwise.workloads import first_turn_prompts

DW_METHODS = {"dw-plain": {"proposer": "none"}, "dw-lookup": {"proposer": "prompt-lookup"}}
DEFAULT_VLLM = "vllm-plain;vllm-ngram:k=4;vllm-custom=prompt-lookup:k=4"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--workload", default="humaneval:0-7")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1,
                    help="draftwise's torch threads (vLLM's CPU build binds one compute thread on a 2-core machine)")
    ap.add_argument("--vllm-methods", default=DEFAULT_VLLM, help="';'-separated vLLM method strings")
    ap.add_argument("--dw-methods", default=",".join(DW_METHODS))
    ap.add_argument("--eager", action="store_true", help="vLLM enforce_eager (no torch.compile: minutes less per engine)")
    ap.add_argument("--iomp", action="store_true", help="preload vLLM's Intel OpenMP")
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def run_draftwise(name: str, spec: DecoderSpec, base, prompts: list[list[int]], batches: list[int]) -> list[dict]:
    decoder = open_decoder(spec, loader=lambda *_: base.target, **DW_METHODS[name])
    decoder.generate_many(prompts[:1], max_batch=1)  # warm-up, as the vLLM worker does
    cells = []
    for batch in batches:
        start, tokens = time.perf_counter(), []
        for i in range(0, len(prompts), batch):  # groups of B, as the vLLM worker runs them
            for result in decoder.generate_many(prompts[i:i + batch], max_batch=batch):
                if isinstance(result, BaseException):
                    raise result
                tokens.append(list(result.tokens))
        wall = time.perf_counter() - start
        cells.append({"method": name, "batch": batch, "tokens": tokens, "wall_s": wall,
                      "new_tokens": sum(len(t) for t in tokens), "spec_counters": {}})
        print(f"{name} B={batch}: {cells[-1]['new_tokens'] / wall:.1f} tok/s", flush=True)
    return cells


def compare(cell: dict, reference: dict | None) -> dict:
    """Requests whose tokens differ from the reference's, and the shortest agreeing prefix."""
    if reference is None:
        return {"mismatches": None, "min_common_prefix": None}
    pairs = list(zip(cell["tokens"], reference["tokens"]))
    return {"mismatches": sum(list(a) != list(b) for a, b in pairs),
            "min_common_prefix": min(accepted_prefix(list(a), list(b)) for a, b in pairs)}


def rate(cell: dict | None) -> float | None:
    return None if cell is None else cell["new_tokens"] / cell["wall_s"]


def report(args: argparse.Namespace, cells: list[dict], batches: list[int], prompts: int) -> str:
    find = {(c["method"], c["batch"]): c for c in cells}
    lines = [f"# vLLM beside draftwise: {args.target}, {args.dtype}", "",
             f"{args.workload} first turns ({prompts} prompts, chat template), {args.max_new} new tokens, greedy; "
             f"groups of B; draftwise {args.threads} thread(s); vLLM enforce_eager={args.eager}, iomp={args.iomp}.", "",
             "| method | B | tok/s | x vllm-plain | x dw-plain | accepted / drafted | differs from vllm-plain "
             "(shortest common prefix) | differs from dw-plain B=1 |", "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        mine, plain_v, plain_d = rate(c), rate(find.get(("vllm-plain", c["batch"]))), rate(find.get(("dw-plain", c["batch"])))
        ratios = [f"{mine / r:.2f}" if r else "" for r in (plain_v, plain_d)]
        spec = c["spec_counters"]
        acc = f"{spec['accepted']:.0f} / {spec['draft_tokens']:.0f}" if spec.get("draft_tokens") else ""
        to_vllm = compare(c, find.get(("vllm-plain", c["batch"])))
        to_dw = compare(c, find.get(("dw-plain", batches[0])))
        n = len(c["tokens"])
        lines.append(f"| {c['method']} | {c['batch']} | {mine:.1f} | {ratios[0]} | {ratios[1]} | {acc} "
                     f"| {to_vllm['mismatches']}/{n} ({to_vllm['min_common_prefix']}) "
                     f"| {to_dw['mismatches']}/{n} ({to_dw['min_common_prefix']}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    spec = DecoderSpec(target=args.target, backend="transformers", dtype=args.dtype, threads=args.threads,
                       generation=GenerationConfig(max_new_tokens=args.max_new))
    base = open_decoder(spec, proposer="none")
    prompts = first_turn_prompts(base.target.chat_prompt, args.workload)
    methods = tuple(parse_method(m) for m in args.vllm_methods.split(";") if m)
    request = WorkerRequest(model=str(vllm_checkpoint(args.target)), dtype=args.dtype,
                            prompts=tuple(tuple(p) for p in prompts), max_tokens=args.max_new,
                            batch_sizes=tuple(batches), methods=methods, enforce_eager=args.eager)
    cells = [c for name in filter(None, args.dw_methods.split(",")) for c in run_draftwise(name, spec, base, prompts, batches)]
    started = time.perf_counter()
    outcome = run_worker(request, VllmEnvironment(iomp=args.iomp), log_path=args.out / "vllm.log")
    print(f"vLLM: {len(methods)} engines in {time.perf_counter() - started:.0f} s", flush=True)
    for name, error in outcome.errors.items():
        print(f"vLLM refused {name}: {error} (root cause in vllm.log)", flush=True)
    cells += [{"method": r.method, "batch": r.batch, "tokens": [list(t) for t in r.tokens], "wall_s": r.wall_s,
               "new_tokens": r.new_tokens, "spec_counters": dict(r.spec_counters), "load_s": r.load_s} for r in outcome.results]
    (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "prompts": [list(p) for p in prompts], "cells": cells,
                                                       "refused": dict(outcome.errors)}))
    text = report(args, cells, batches, len(prompts)) + "".join(
        f"\nvLLM refused `{name}`: {error} (root cause in vllm.log)\n" for name, error in outcome.errors.items())
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
