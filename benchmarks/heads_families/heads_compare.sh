#!/usr/bin/env bash
# Issue 28's comparison: the four head families (committed heads of the embedded model, one
# data set) on the same trees at three node budgets, beside plain decoding and prompt lookup +
# gate, interleaved question by question in ONE run per backend and temperature.  Usage:
#   BACKEND=transformers|llamacpp TEMPERATURE=0|1 [BUDGETS="5 8 16"] [AUTO=1] [TARGET=smollm2-135m] [MAX_NEW=128] \
#     [WORKLOAD_CHAT=spec-bench:all:13] [WORKLOAD_CODE=humaneval:2-4] bash benchmarks/heads_families/heads_compare.sh [OUT_DIR] [bench flags, e.g. --resume]
# then: .venv/bin/python benchmarks/heads_families/heads_compare.py benchmarks/heads_families/runs/* (writes benchmarks/heads_families/comparison/)
# The workload is narrowed for a 2-core CPU session: one Spec-Bench development question per
# category and HumanEval 2-4 (auto trees calibrate on HumanEval 0-1).
set -euo pipefail
cd "$(dirname "$0")/../.."
backend="${BACKEND:-transformers}"
temperature="${TEMPERATURE:-0}"
out="${1:-$(bash benchmarks/peers/run_dir.sh heads_families "${TARGET:-smollm2-135m}-${backend}-t${temperature}")}"
[ $# -gt 0 ] && shift
# The same trees for every family, by node budget (root included): the top-1 chain through
# the four heads, and two sparse trees that widen the shallow levels where heads are surest.
declare -A trees=(
  [3]="chain:2"  # for a target whose t(n) climbs steeply past 3 rows (Qwen 1.5B on 2 cores)
  [5]="chain:4"
  [8]="[[0],[1],[2],[0,0],[0,1],[0,0,0],[0,0,0,0]]"
  [16]="[[0],[1],[2],[3],[0,0],[0,1],[0,2],[1,0],[1,1],[0,0,0],[0,0,1],[0,1,0],[1,0,0],[0,0,0,0],[0,0,0,1]]"
)
methods=(--method "plain=dw:proposer=none,backend=$backend"
         --method "lookup-gate=dw:proposer=prompt-lookup,backend=$backend,gate=auto")
for family in medusa hydra hydra++ clover; do
  for n in ${BUDGETS:-5 8 16}; do
    methods+=(--method "${family/++/pp}-n$n=dw:proposer=$family,backend=$backend,tree=${trees[$n]}")
  done
  # AUTO=1: each family's best tree for this hardware by tree=auto (on a steep t(n) it is no tree)
  [ -n "${AUTO:-}" ] && methods+=(--method "${family/++/pp}-auto=dw:proposer=$family,backend=$backend,tree=auto")
done
exec .venv/bin/draftwise bench --workload "${WORKLOAD_CHAT:-spec-bench:all:13}" --workload "${WORKLOAD_CODE:-humaneval:2-4}" \
  --target "${TARGET:-smollm2-135m}" --max-new-tokens "${MAX_NEW:-128}" --temperature "$temperature" --seed 0 --repeats 1 \
  --threads 2 --out "$out" "${methods[@]}" "$@"
