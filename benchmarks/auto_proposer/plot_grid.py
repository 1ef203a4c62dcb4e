"""Measured and predicted speedup against tree size, one line per depth (issue 7's grid plot).

Reads what `predict_vs_measured.py` wrote for a bench run (`auto_proposer/RUN.json`) and the
run's own method list (`RUN/run.json`); every ungated prompt-lookup method is a grid point with
depth d = its lookup length and tree size n = 1 + d x candidates (the rows a full round
verifies, root included).  Gated and other methods are not grid points and are left out.

    .venv/bin/python benchmarks/auto_proposer/plot_grid.py --measured benchmarks/lookup_grid
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.bench.methods import MethodDefaults, parse_method
from draftwise.engine import GenerationConfig


def grid_points(run: dict, predictions: dict) -> list[dict]:
    defaults = MethodDefaults(target=run["target"], draft=run["draft"], generation=GenerationConfig())
    specs = {m.name: m.decoder for m in (parse_method(text, defaults) for text in run["methods"]) if m.kind == "dw"}
    points = []
    for row in predictions["methods"]:
        spec = specs.get(row["method"])
        if spec is None or spec.proposer != "prompt-lookup" or spec.gate:
            continue
        d, c = spec.prompt_lookup.num_tokens, spec.prompt_lookup.max_candidates
        points.append({**row, "d": d, "candidates": c, "n": 1 + d * c})
    return points


def plot(points: list[dict], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d in sorted({p["d"] for p in points}):
        line = sorted((p for p in points if p["d"] == d), key=lambda p: p["n"])
        n = [p["n"] for p in line]
        drawn, = ax.plot(n, [p["measured_speedup"] for p in line], "o-", label=f"measured, d={d}")
        ax.plot(n, [p["predicted_speedup"] for p in line], "x--", color=drawn.get_color(), label=f"predicted, d={d}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree size n (rows a full round verifies, root included)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", required=True, type=Path, help="the bench results directory")
    parser.add_argument("--predictions", type=Path, help="default: auto_proposer/<run name>.json")
    args = parser.parse_args()
    predictions_path = args.predictions or Path(__file__).parent / f"{args.measured.name}.json"
    predictions = json.loads(predictions_path.read_text())
    points = grid_points(json.loads((args.measured / "run.json").read_text()), predictions)
    if not points:
        raise SystemExit(f"no ungated prompt-lookup methods in {args.measured}: nothing to plot")
    title = (f"prompt lookup on {predictions['backend']}, {', '.join(predictions['workloads'])}, "
             f"median error {100 * predictions['median_relative_error']:.1f}%")
    print(plot(points, title, predictions_path.with_suffix(".png")))


if __name__ == "__main__":
    main()
