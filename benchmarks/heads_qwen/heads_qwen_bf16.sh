#!/usr/bin/env bash
# Issue 27, Qwen target on transformers in bfloat16: the float32 verify profile of this CPU
# (verify_profiles/ of benchmarks/heads_qwen/runs/amd-epyc-2026-12-02-transformers-bf16: t(2) = 1.97 t(1)) makes tree=auto choose plain decoding
# for both head families; bfloat16 halves the weights streamed per step and flattens t(n), so
# the same heads (trained on float32 states) get their chance.  Every method here, plain
# decoding included, runs the bfloat16 model; exactness is checked against bfloat16 plain.
#   bash benchmarks/heads_qwen/heads_qwen_bf16.sh [OUT_DIR] [--resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(bash benchmarks/peers/run_dir.sh heads_qwen transformers-bf16)}"
[ $# -gt 0 ] && shift
b="backend=transformers"
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD_CHAT:-spec-bench:all:2}" --workload "${WORKLOAD_CODE:-humaneval:2-3}" \
  --target qwen2.5-coder-1.5b --dtype bfloat16 \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 --out "$out" \
  --method "dw-plain=dw:proposer=none,$b" \
  --method "dw-medusa-auto=dw:proposer=medusa,$b,tree=auto" \
  --method "dw-hydra-auto=dw:proposer=hydra,$b,tree=auto" \
  --method "dw-hydra-chain=dw:proposer=hydra,$b" "$@"
