#!/usr/bin/env bash
# Issue 30 evidence: the batch-invariance probe of the embedded model and the Qwen target on
# llama.cpp, default kernels and both strict sets (chains: probed on chains only; trees), two threads (chains and random trees of 2-16 rows after
# 40, 256 and 700 committed tokens; every row compared with plain decoding's row of the same
# path).  Writes one invariance_probe artifact per (model, kernels) and a combined plot.
# About 25 minutes on the 2-core machine, most of it the Qwen probes.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(bash benchmarks/peers/run_dir.sh llamacpp_exactness invariance)}"
mkdir -p "$out"
for target in smollm2-135m qwen2.5-coder-1.5b; do
  for mode in default strict-chains strict-trees; do
    flag=(); [ "$mode" != default ] && flag=(--strict "${mode#strict-}")
    .venv/bin/draftwise profile --invariance --target "$target" --backend llamacpp --threads 2 "${flag[@]}" \
      --out "$out/$target-$mode" | tee "$out/$target-$mode.txt"
  done
done
.venv/bin/python - "$out" <<'PY'
import sys
from pathlib import Path
from draftwise.measure.invariance import InvarianceProbe
from draftwise.bench.plots import plot_invariance
root = Path(sys.argv[1])
for target in ("smollm2-135m", "qwen2.5-coder-1.5b"):
    modes = ("default", "strict-chains", "strict-trees")
    probes = [InvarianceProbe.load(root / f"{target}-{mode}") for mode in modes]
    plot_invariance(probes, root / f"{target}.png")
    for mode, p in zip(modes, probes):
        print(f"{target} {mode}: bit-identical up to {p.exact_rows} rows, max |diff| {p.max_abs_diff:.3g}")
PY
