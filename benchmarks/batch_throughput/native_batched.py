"""Our plain multi-sequence decode on llama.cpp (`LlamaCppBatch`) against llama.cpp's own
`llama-batched-bench`, in the same shape, on the same GGUF and threads.

llama-cpp-python has no multi-sequence generate, so draftwise's plain batched decoding is the
llama.cpp baseline of `benchmarks/batch_throughput/`; this checks it against llama.cpp's own tool
(built from the source vendored in the installed llama-cpp-python by `native_batched.sh`).  The
shape is the tool's "prompt not shared" mode: B sequences each read a prompt of PP tokens, then
TG steps each decode one token per sequence.  Ours: one `verify_many` with every slot's prompt
(`unread`), then TG rounds of one pending row per slot (`verify_many`, argmax of each slot's
logits, `commit`), timed as the tool times its phases (T_PP, T_TG; S_TG = B * TG / T_TG).
The tool decodes without sampling; ours includes the argmax and the bookkeeping of a real decode.
Kernels as draftwise's defaults (flash attention off, repacked weights: the tool gets `-fa off`).
Interleaved repeats (ours, then the tool, alternating first); medians and ranges.

    bash benchmarks/batch_throughput/native_batched.sh \\
        "$(bash benchmarks/peers/run_dir.sh batch_throughput native-batched)"
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from draftwise.backends.batch import VerifyCall
from draftwise.backends.llamacpp import LlamaCppBackend, LlamaCppBatch
from draftwise.bench.study import read_noise, write_study
from draftwise.models import resolve
from draftwise.timing import Spread


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tool", required=True, type=Path, help="the llama-batched-bench binary")
    ap.add_argument("--npp", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--ntg", type=int, default=64, help="generated tokens per sequence")
    ap.add_argument("--npl", default="1,2,4,8", help="sequences (batch sizes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True, type=Path)
    return ap.parse_args(argv)


def ours(backend: LlamaCppBackend, prompt: list[int], b: int, ntg: int) -> dict:
    """B slots read `prompt` each, then `ntg` plain steps per slot: T_PP, T_TG in seconds."""
    batch = LlamaCppBatch.from_backend(backend, b, max_tree_leaves=0, slot_ctx=len(prompt) + ntg + 8)
    try:
        slots = [batch.open() for _ in range(b)]
        start = time.perf_counter()
        logits = batch.verify_many([VerifyCall(s, prompt[-1], None, tuple(prompt[:-1])) for s in slots])
        for s in slots:
            batch.commit(s, [])
        t_pp = time.perf_counter() - start
        pending = [int(np.argmax(x.logits[-1])) for x in logits]
        start = time.perf_counter()
        for _ in range(ntg):
            logits = batch.verify_many([VerifyCall(s, p, None) for s, p in zip(slots, pending)])
            pending = [int(np.argmax(x.logits[-1])) for x in logits]
            for s in slots:
                batch.commit(s, [])
        t_tg = time.perf_counter() - start
    finally:
        batch.free()
    return {"t_pp": t_pp, "t_tg": t_tg}


def native(tool: Path, gguf: str, npp: int, ntg: int, b: int, threads: int) -> dict:
    """One run of llama-batched-bench for one batch size (its JSONL row)."""
    command = [str(tool), "-m", gguf, "-c", str(b * (npp + ntg) + 64), "-b", "512", "-ub", "512", "-npp", str(npp),
               "-ntg", str(ntg), "-npl", str(b), "-t", str(threads), "-fa", "off", "--output-format", "jsonl"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(rows) != 1:
        raise RuntimeError(f"llama-batched-bench printed {len(rows)} JSON rows:\n{done.stdout}\n{done.stderr[-2000:]}")
    return {"t_pp": float(rows[0]["t_pp"]), "t_tg": float(rows[0]["t_tg"]), "raw": rows[0]}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.npl.split(",")]
    model = resolve(args.model)
    backend = LlamaCppBackend.load(model, n_threads=args.threads)
    text = backend.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 40)
    prompt = text[: args.npp]
    probe = prompt[:32]

    noise = {"start": read_noise(backend, probe)}
    print(f"noise check at the start: {noise['start']}", flush=True)
    cells: list[dict] = []
    for repeat in range(args.repeats):
        for b in batches:
            for who in (("ours", "llama-batched-bench") if (repeat + b) % 2 == 0 else ("llama-batched-bench", "ours")):
                got = ours(backend, prompt, b, args.ntg) if who == "ours" else \
                    native(args.tool, model.path, args.npp, args.ntg, b, args.threads)
                cell = {"who": who, "batch": b, "repeat": repeat, "t_pp": got["t_pp"], "t_tg": got["t_tg"],
                        "s_tg": b * args.ntg / got["t_tg"], "s_pp": b * args.npp / got["t_pp"]}
                cells.append(cell)
                print(f"B={b} {who:19s} r{repeat}: S_TG {cell['s_tg']:7.1f} t/s, S_PP {cell['s_pp']:7.1f} t/s", flush=True)
    noise["end"] = read_noise(backend, probe)
    print(f"noise check at the end: {noise['end']}", flush=True)
    rows = []
    for b in batches:
        mine = {who: [c for c in cells if c["batch"] == b and c["who"] == who] for who in ("ours", "llama-batched-bench")}
        spreads = {who: {key: Spread.of([c[key] for c in got]) for key in ("s_tg", "s_pp")} for who, got in mine.items()}
        ratio = Spread.of([o["s_tg"] / n["s_tg"] for o, n in zip(mine["ours"], mine["llama-batched-bench"])])
        rows.append({"batch": b, "spreads": spreads, "ratio": ratio})
    summary = [{"batch": r["batch"], "ours_over_native_tg": r["ratio"], **r["spreads"]} for r in rows]
    lines = [f"# Plain multi-sequence decode: draftwise's LlamaCppBatch against llama-batched-bench "
             f"({args.model}, PP = {args.npp}, TG = {args.ntg}, {args.threads} threads, {args.repeats} repeats)", "",
             f"Noise check: start {noise['start']}; end {noise['end']}.", "",
             "| B | ours S_TG t/s (range) | llama-batched-bench S_TG t/s (range) | ours / native (per repeat: median, range) "
             "| ours S_PP t/s | native S_PP t/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        us, them = r["spreads"]["ours"], r["spreads"]["llama-batched-bench"]
        lines.append(f"| {r['batch']} | {us['s_tg'].cell(1)} | {them['s_tg'].cell(1)} | {r['ratio'].cell(3)} "
                     f"| {us['s_pp'].median:.0f} | {them['s_pp'].median:.0f} |")
    write_study(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                           "machine": platform.processor() or platform.machine(), "gguf": model.path, "noise": noise,
                           "cells": cells, "rows": summary}, lines)


if __name__ == "__main__":
    main(sys.argv[1:])
