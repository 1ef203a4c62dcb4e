"""Collect the training figures of head-set artifacts into runs.json and a markdown table.

    .venv/bin/python benchmarks/heads_training/collect.py --json RUN/runs.json NAME=DIR ... > RUN/table.md

RUN: a run directory, benchmarks/heads_training/runs/<machine>-<date>-<what> (runs/ holds the
committed ones).  --json: where runs.json goes (default: runs.json in the current directory).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    args = sys.argv[1:]
    out = Path("runs.json")
    if args[:1] == ["--json"]:
        out, args = Path(args[1]), args[2:]
    runs = {}
    for item in args:
        name, _, directory = item.partition("=")
        provenance = json.loads((Path(directory) / "manifest.json").read_text())["provenance"]
        metrics = provenance["metrics"]
        runs[name] = {
            "family": provenance["family"], "arch": provenance["arch"], "recipe": provenance["recipe"],
            "losses": provenance["losses"], "conditioning": provenance["conditioning"],
            "top1": metrics["validation"]["top1"], "top5": metrics["validation"]["top5"],
            "parameters": metrics.get("parameters"), "train_seconds": metrics.get("train_seconds"),
            "steps": metrics["steps"], "hidden_cache": provenance["data"]["hidden_cache"],
            "size_bytes": (Path(directory) / "heads.safetensors").stat().st_size,
        }
    out.write_text(json.dumps(runs, indent=2) + "\n")
    print("| run | family | options | top-1 by depth | top-5 by depth | params | MB (bf16) | train s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        recipe = r["recipe"]
        options = [f"layers={r['arch']['layers']}"]
        options += ["prefix"] if r["arch"].get("prefix") else []
        if recipe.get("teacher_weight"):
            options.append(f"teacher={recipe['teacher_weight']:g}, hard={recipe.get('hard_weight', 1.0):g}")
        if recipe.get("segment_batches"):
            options.append("segment batches")
        if recipe.get("conditioning", "teacher") != "teacher":
            options.append(f"conditioning={recipe['conditioning']}")
        options.append(f"lr={recipe['lr']:g}")
        fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        print(f"| {name} | {r['family']} | {', '.join(options)} | {fmt(r['top1'])} | {fmt(r['top5'])} | "
              f"{r['parameters'] or ''} | {r['size_bytes'] / 1e6:.1f} | {r['train_seconds'] or ''} |")


if __name__ == "__main__":
    main()
