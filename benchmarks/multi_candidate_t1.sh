#!/usr/bin/env bash
# Issue 5, reduced run: acceptance of multi-candidate draft trees at temperature 1.0 on the
# Qwen pair (llama.cpp, 2 threads): one-draft rejection chains vs SpecInfer (i.i.d. children)
# vs Sequoia (without replacement) vs membership trees at equal node budgets 8 and 16
# (cartesian:2,3 and cartesian:4,3), HumanEval 0-2 and 3 stratified Spec-Bench questions,
# 64 new tokens.  The issue's full run (60 prompts, 128 tokens, T = 0.7 and 1.0, budgets
# 8/16/32) does not fit this machine's session; WORKLOAD/--max-new-tokens widen it.
set -euo pipefail
cd "$(dirname "$0")/.."
d="proposer=draft-model,backend=llamacpp"
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD1:-humaneval:0-2}" --workload "${WORKLOAD2:-spec-bench:3}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 64 --temperature 1.0 --seed 0 --repeats 1 --threads 2 \
  --out benchmarks/multi_candidate_t1 \
  --method plain=dw:proposer=none,backend=llamacpp \
  --method chain-8=dw:$d,k=8,confidence=0 \
  --method specinfer-8=dw:$d,tree=cartesian:2,3,relation=iid \
  --method sequoia-8=dw:$d,tree=cartesian:2,3,relation=without_replacement \
  --method membership-8=dw:$d,tree=cartesian:2,3,relation=iid,verifier=membership \
  --method chain-16=dw:$d,k=16,confidence=0 \
  --method specinfer-16=dw:$d,tree=cartesian:4,3,relation=iid \
  --method sequoia-16=dw:$d,tree=cartesian:4,3,relation=without_replacement \
  --method membership-16=dw:$d,tree=cartesian:4,3,relation=iid,verifier=membership "$@"
