#!/usr/bin/env bash
# Issue 46's check of a heterogeneous round against its sources alone: the gated union of prompt
# lookup and Hydra++ (the heads' planned tree, a depth per source, unguarded) beside gated lookup,
# Hydra++ `tree=auto` and plain decoding, per category, in ONE run.  Workload as auto.sh's:
# 13 Spec-Bench development questions (both turns) + HumanEval 0-3, SmolLM2-135M on transformers
# float32, 128 new tokens, greedy, 2 threads, 2 interleaved repeats (REPEATS), method order rotated.
# Usage: [REPEATS=2] bash benchmarks/heterogeneous/union.sh OUT_DIR [bench flags, e.g. --resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: union.sh OUT_DIR}"
shift
exec .venv/bin/draftwise bench --workload spec-bench:13 --workload humaneval:0-3 --target smollm2-135m \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats "${REPEATS:-2}" --threads 2 --out "$out" \
  --method "plain=dw:proposer=none,backend=transformers" \
  --method "lookup-gate=dw:proposer=prompt-lookup,backend=transformers,gate=auto" \
  --method "hydrapp-auto=dw:proposer=hydra++,backend=transformers,tree=auto" \
  --method "union-tree-gate=dw:proposer=prompt-lookup+hydra++,backend=transformers,tree=auto,gate=auto,guard=false" \
  "$@"
