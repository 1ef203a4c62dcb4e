#!/usr/bin/env bash
# Issue 5's benchmark: the 0.5B draft's one-draft rejection chain vs SpecInfer (children drawn
# i.i.d.) vs Sequoia (children drawn without replacement) vs membership trees at equal budgets
# of 8, 16 and 32 candidates, on the Qwen pair, llama.cpp (this machine's fastest backend,
# 2 threads), HumanEval 0-19 + 40 stratified Spec-Bench questions, 128 new tokens, all methods
# interleaved prompt by prompt with plain sampling; `--resume` (passed through) continues.
#   TEMPERATURE=1.0 (default) or 0.7; OUT, BUDGETS ("8 16 32"), WORKLOAD1/WORKLOAD2 narrow it.
#
# Tree shapes, as Sequoia builds them: for each budget B and each way of drawing children, the
# DP tree of B + 1 nodes (root included) of depth <= B / 2 (MAX_DEPTH overrides) for the draft's
# positional acceptance under that drawing, measured by `draftwise calibrate` at the same
# temperature with 4 children per parent on HumanEval 150-163 (outside the workload).  SpecInfer
# and membership get the i.i.d. tree, Sequoia the without-replacement one; the chain of B drafts
# has as many rows.  The depth bound is what makes them trees: this Qwen pair's first draft is
# accepted ~87% of the time at temperature 1.0, so the unbounded DP answer at every budget up
# to 19 is the chain itself (printed below as the chain's predicted E[G] against the trees').
set -euo pipefail
cd "$(dirname "$0")/../.."
temperature="${TEMPERATURE:-1.0}"
out="${OUT:-$(bash benchmarks/peers/run_dir.sh multi_candidate t${temperature//./})}"
for relation in iid without_replacement; do
  calibration="$out-calibration-$relation"  # beside the results: `draftwise bench` owns its --out directory
  if [ ! -f "$calibration/acceptance.json" ]; then
    .venv/bin/draftwise calibrate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --backend llamacpp \
      --threads 2 --width 4 --relation "$relation" --workload humaneval:150-163 --max-new-tokens 48 \
      --temperature "$temperature" --seed 0 --out "$calibration"
  fi
done
dp_tree() {  # dp_tree RELATION BUDGET DEPTH: the Sequoia DP tree as JSON paths; E[G] on stderr
  .venv/bin/python - "$out-calibration-$1" "$2" "$3" <<'PY'
import json, sys
from pathlib import Path
from draftwise.optimize.acceptance import AcceptanceProfile
from draftwise.optimize.sequoia_dp import solve

budget, depth = int(sys.argv[2]), int(sys.argv[3])
table = solve(AcceptanceProfile.load(Path(sys.argv[1])).matrix, budget + 1, budget)
print(f"{Path(sys.argv[1]).name}: E[G] of the best {budget + 1}-node tree, depth <= {depth}: "
      f"{table.value(budget + 1, depth):.3f}; any depth: {table.value(budget + 1, budget):.3f}", file=sys.stderr)
print(json.dumps([list(path) for path in table.paths(budget + 1, depth)], separators=(",", ":")))
PY
}
draft="proposer=draft-model,backend=llamacpp"
methods=(--method "plain=dw:proposer=none,backend=llamacpp")
for budget in ${BUDGETS:-8 16 32}; do
  depth="${MAX_DEPTH:-$((budget / 2))}"
  iid=$(dp_tree iid "$budget" "$depth")
  wor=$(dp_tree without_replacement "$budget" "$depth")
  echo "budget $budget: i.i.d. tree $iid; without-replacement tree $wor" >&2
  methods+=(--method "chain-$budget=dw:$draft,k=$budget,confidence=0"
            --method "specinfer-$budget=dw:$draft,tree=$iid,relation=iid"
            --method "sequoia-$budget=dw:$draft,tree=$wor,relation=without_replacement"
            --method "membership-$budget=dw:$draft,tree=$iid,relation=iid,verifier=membership")
done
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD1:-humaneval:0-19}" \
  --workload "${WORKLOAD2:-spec-bench:40}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature "$temperature" --seed 0 --repeats 1 --threads 2 \
  --out "$out" "${methods[@]}" "$@"
