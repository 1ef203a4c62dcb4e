#!/usr/bin/env bash
# Issue 5's benchmark: the 0.5B draft's one-draft rejection chain vs SpecInfer (children drawn
# i.i.d.) vs Sequoia (children drawn without replacement) vs membership trees at equal budgets
# of 8, 16 and 32 candidates, on the Qwen pair, llama.cpp (this machine's fastest backend,
# 2 threads), HumanEval 0-19 + 40 stratified Spec-Bench questions, 128 new tokens, all methods
# interleaved prompt by prompt with plain sampling; `--resume` (passed through) continues.
#   TEMPERATURE=1.0 (default) or 0.7; OUT, BUDGETS ("8 16 32"), WORKLOAD1/WORKLOAD2 narrow it.
#
# Tree shapes: for each budget B, Sequoia's DP tree of B + 1 nodes (root included, any depth)
# for the draft's positional acceptance, measured by `draftwise calibrate` at the same
# temperature with 4 children drawn without replacement, on HumanEval 150-153 (outside the
# workload).  SpecInfer, Sequoia and membership verify that same shape, so they differ only in
# how children are drawn and checked; the chain of B drafts has the same number of rows.
set -euo pipefail
cd "$(dirname "$0")/.."
temperature="${TEMPERATURE:-1.0}"
out="${OUT:-benchmarks/multi_candidate_t${temperature//./}}"
calibration="$out-calibration"  # beside the results: `draftwise bench` owns its --out directory
if [ ! -f "$calibration/acceptance.json" ]; then
  .venv/bin/draftwise calibrate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --backend llamacpp \
    --threads 2 --width 4 --relation without_replacement --workload humaneval:150-153 --max-new-tokens 48 \
    --temperature "$temperature" --seed 0 --out "$calibration"
fi
draft="proposer=draft-model,backend=llamacpp"
methods=(--method "plain=dw:proposer=none,backend=llamacpp")
for budget in ${BUDGETS:-8 16 32}; do
  tree=$(.venv/bin/python - "$calibration" "$budget" <<'PY'
import json, sys
from pathlib import Path
from draftwise.optimize.acceptance import AcceptanceProfile
from draftwise.optimize.sequoia_dp import solve

budget = int(sys.argv[2])
table = solve(AcceptanceProfile.load(Path(sys.argv[1])).matrix, budget + 1, budget)
print(json.dumps([list(path) for path in table.paths(budget + 1, budget)], separators=(",", ":")))
PY
)
  echo "budget $budget: Sequoia DP tree $tree" >&2
  methods+=(--method "chain-$budget=dw:$draft,k=$budget,confidence=0"
            --method "specinfer-$budget=dw:$draft,tree=$tree,relation=iid"
            --method "sequoia-$budget=dw:$draft,tree=$tree,relation=without_replacement"
            --method "membership-$budget=dw:$draft,tree=$tree,relation=iid,verifier=membership")
done
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD1:-humaneval:0-19}" \
  --workload "${WORKLOAD2:-specbench:../shared/data/spec_bench/question.jsonl:40}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature "$temperature" --seed 0 --repeats 1 --threads 2 \
  --out "$out" "${methods[@]}" "$@"
