"""Measured and predicted speedup against tree size, one line per depth (issue 7's grid plot).

Reads what `predict_vs_measured.py` wrote for a bench run (`RUN/predicted.json`) and the
run's own method list (`RUN/run.json`); every ungated prompt-lookup method is a grid point with
depth d = its lookup length and tree size n = 1 + d x candidates (the rows a full round
verifies, root included).  Gated and other methods are not grid points and are left out.

    .venv/bin/python benchmarks/lookup_grid/plot_grid.py --measured benchmarks/lookup_grid/runs/amd-epyc-2026-12-01-humaneval-t0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.bench.methods import MethodDefaults, parse_method
from draftwise.bench.plots import plot_speedup_grid
from draftwise.runtime.round import GenerationConfig


def grid_points(run: dict, predictions: dict) -> list[dict]:
    defaults = MethodDefaults(target=run["target"], draft=run["draft"], generation=GenerationConfig())
    specs = {m.name: m.decoder for m in (parse_method(text, defaults) for text in run["methods"]) if m.kind == "dw"}
    points = []
    for row in predictions["methods"]:
        spec = specs.get(row["method"])
        if spec is None or spec.proposer != "prompt-lookup" or spec.gate:
            continue
        d, c = spec.family_config.num_tokens, spec.family_config.max_candidates
        points.append({**row, "d": d, "candidates": c, "n": 1 + d * c})
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", required=True, type=Path, help="the bench results directory")
    parser.add_argument("--predictions", type=Path, help="default: MEASURED/predicted.json")
    args = parser.parse_args()
    predictions_path = args.predictions or args.measured / "predicted.json"
    predictions = json.loads(predictions_path.read_text())
    points = grid_points(json.loads((args.measured / "run.json").read_text()), predictions)
    if not points:
        raise SystemExit(f"no ungated prompt-lookup methods in {args.measured}: nothing to plot")
    title = (f"prompt lookup on {predictions['backend']}, {', '.join(predictions['workloads'])}, "
             f"T = {predictions['temperature']:g}, median error {100 * predictions['median_relative_error']:.1f}%")
    print(plot_speedup_grid(points, predictions_path.with_suffix(".png"), title))


if __name__ == "__main__":
    main()
