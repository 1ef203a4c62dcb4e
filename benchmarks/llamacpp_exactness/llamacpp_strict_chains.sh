#!/usr/bin/env bash
# Issue 30 run: what strict costs for chain drafters.  `strict=true` on a drafter that never
# branches (and on plain decoding) loads STRICT_CHAIN_KERNELS: flash attention off as by default,
# every decode of >= 2 rows, so multi-row verifies cost what they cost by default and only
# one-row steps pay t(2)/t(1).  Greedy, 128 new tokens, HumanEval 0-9 + the first 10 Spec-Bench
# development questions, one run, side by side with the default kernels; each method is checked
# against the plain decoding of its own kernel set.  About 15 minutes alone on the 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$(bash benchmarks/peers/run_dir.sh llamacpp_exactness strict-chains)}"
cpp="backend=llamacpp"
.venv/bin/draftwise bench \
  --workload humaneval:0-9 --workload spec-bench:10 \
  --target smollm2-135m --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --out "$out" \
  --method plain=dw:proposer=none,$cpp \
  --method lookup=dw:proposer=prompt-lookup,$cpp \
  --method lookup-gate=dw:proposer=prompt-lookup,$cpp,gate=auto \
  --method strict-plain=dw:proposer=none,$cpp,strict=true \
  --method strict-lookup=dw:proposer=prompt-lookup,$cpp,strict=true \
  --method strict-lookup-gate=dw:proposer=prompt-lookup,$cpp,gate=auto,strict=true "$@"
.venv/bin/python benchmarks/llamacpp_exactness/llamacpp_ties.py "$out" --workload humaneval:0-9 --workload spec-bench:10
