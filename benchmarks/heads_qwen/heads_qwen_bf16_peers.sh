#!/usr/bin/env bash
# Issue 27, Qwen target on transformers in bfloat16, the comparison methods of
# benchmarks/heads_qwen/heads_qwen_bf16.sh's heads on the same workload and dtype: plain decoding (the
# shared reference), prompt lookup + cost gate, the 0.5B draft model (k=20 chain) and
# transformers' own assisted generation with it.  A second run because a bench refuses to resume
# under other settings.
#   bash benchmarks/heads_qwen/heads_qwen_bf16_peers.sh [OUT_DIR] [--resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(bash benchmarks/peers/run_dir.sh heads_qwen transformers-bf16-peers)}"
[ $# -gt 0 ] && shift
b="backend=transformers"
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD_CHAT:-spec-bench:all:2}" --workload "${WORKLOAD_CODE:-humaneval:2-3}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --dtype bfloat16 \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 --out "$out" \
  --method "dw-plain=dw:proposer=none,$b" \
  --method "dw-prompt-lookup-gate=dw:proposer=prompt-lookup,$b,gate=auto" \
  --method "dw-draft-k20=dw:proposer=draft-model,$b,k=20" \
  --method hf-assisted "$@"
