#!/usr/bin/env bash
# Issue 27's benchmark on the Qwen target (qwen2.5-coder-1.5b), greedy, 128 new tokens, one run
# per backend, interleaved question by question: plain decoding, prompt lookup + cost gate, the
# 0.5B draft model (k=20, the best chain of benchmarks/peers/runs/amd-epyc-2026-11-29-transformers-draft-k20), and the Medusa and
# Hydra heads trained into the cache by
#   draftwise heads train --family hydra  --target qwen2.5-coder-1.5b --preset hydra \
#     --set prompts=192 --set validation=24 --set answer_tokens=96 --set prompt_tokens=256 --set epochs=3 --threads 2
#   draftwise heads train --family medusa --target qwen2.5-coder-1.5b --preset medusa-1 (same --set keys)
# each with its best tree by tree=auto.  The workload is narrowed to what a 2-core CPU decodes
# in a session (the 1.5B runs at ~2 tok/s on transformers here): 3 Spec-Bench development
# questions (stratified over categories) and HumanEval 2-4 (the auto trees calibrate on 0-1).
#   BACKEND=transformers|llamacpp bash benchmarks/heads_qwen/heads_qwen.sh [OUT_DIR] [--resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(bash benchmarks/peers/run_dir.sh heads_qwen "${BACKEND:-transformers}")}"
[ $# -gt 0 ] && shift
b="backend=${BACKEND:-transformers}"
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD_CHAT:-spec-bench:all:3}" --workload "${WORKLOAD_CODE:-humaneval:2-4}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 --out "$out" \
  --method "dw-plain=dw:proposer=none,$b" \
  --method "dw-prompt-lookup-gate=dw:proposer=prompt-lookup,$b,gate=auto" \
  --method "dw-draft-k20=dw:proposer=draft-model,$b,k=20" \
  --method "dw-medusa-auto=dw:proposer=medusa,$b,tree=auto" \
  --method "dw-hydra-auto=dw:proposer=hydra,$b,tree=auto" "$@"
