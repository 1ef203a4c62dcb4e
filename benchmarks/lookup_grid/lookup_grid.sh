#!/usr/bin/env bash
# Issue 7, the prompt-lookup grid: tree rows n = 1 + lookup x candidates at depth d = lookup,
# d in {2, 4, 6, 8, 10} x candidates in {1, 2, 4} (15 (n, d) points), plus plain decoding and
# the gated default, on llama.cpp (the fastest plain decoder here), HumanEval 0-9, greedy,
# 128 new tokens, interleaved problem by problem.  Then every point's speedup predicted by
# replaying its rounds on plain traces (benchmarks/lookup_grid/predict_vs_measured.py) sits
# beside the measured one, with what `--proposer auto` picks.  About an hour on 2 cores.
# OUT (default benchmarks/lookup_grid/runs/<machine>-<date>-humaneval-t0) names the run directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$(bash benchmarks/peers/run_dir.sh lookup_grid humaneval-t0)}"
cpp="backend=llamacpp"
methods=(--method plain=dw:proposer=none,$cpp --method lookup-10-gate=dw:proposer=prompt-lookup,$cpp,gate=auto)
for d in 2 4 6 8 10; do
  for c in 1 2 4; do
    methods+=(--method "lookup-$d-x$c=dw:proposer=prompt-lookup,$cpp,lookup=$d,candidates=$c")
  done
done
WORKLOAD="${WORKLOAD:-humaneval:0-9}" bash benchmarks/peers/qwen_bench.sh "$out" "${methods[@]}" "$@"
# predictions and plot into the run's own directory: $out/predicted.{json,md,png}
.venv/bin/python benchmarks/lookup_grid/predict_vs_measured.py --measured "$out" --backend llamacpp
.venv/bin/python benchmarks/lookup_grid/plot_grid.py --measured "$out"
