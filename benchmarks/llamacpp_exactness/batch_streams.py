"""Rows of a shared llama.cpp batch against the same verify on a single-sequence backend, with
one KV stream per slot (a batch of chains only) and with the unified cache (a batch that can
hold trees): `invariance.probe_batch_invariance` for B = 1, 2, 4, 8 and chains of 0, 3 and 7
candidates.  Writes results.json and report.md.

    PYTHONPATH=src .venv/bin/python benchmarks/llamacpp_exactness/batch_streams.py \\
        --out "$(bash benchmarks/peers/run_dir.sh llamacpp_exactness batch-streams)"
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from draftwise.measure.invariance import probe_batch_invariance
from draftwise.backends.llamacpp import LlamaCppBatch
from draftwise.measure.load import load_backend
from draftwise.measure.profile import machine_description


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    single = load_backend(args.model, "llamacpp", args.threads)
    layouts = {}
    for name, leaves in (("one stream per slot (chains only)", 0), ("unified (trees allowed)", 1)):
        batch = LlamaCppBatch.from_backend(single, 8, max_tree_leaves=leaves, slot_ctx=512)
        try:
            layouts[name] = [asdict(c) for c in probe_batch_invariance(batch, single, candidates=(0, 3, 7))]
        finally:
            batch.free()
    (args.out / "results.json").write_text(json.dumps({"model": args.model, "threads": args.threads,
                                                        "machine": machine_description(), "layouts": layouts}, indent=1))
    lines = [f"# Batch rows against a single-sequence verify ({args.model}, llama.cpp default kernels, "
             f"{args.threads} threads, {machine_description()})", "",
             "max |logit difference| of every slot's rows: against the same call verified alone on the batch context, "
             "and against the single backend", "",
             "| KV layout | B | candidates | vs alone on the batch | vs single backend |", "|---|---|---|---|---|"]
    for name, cases in layouts.items():
        for c in cases:
            lines.append(f"| {name} | {c['slots']} | {c['candidates']} | {c['vs_alone']:.3g} | {c['vs_single']:.3g} |")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
