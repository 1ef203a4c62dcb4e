#!/usr/bin/env bash
# Supplement to transformers_core.sh: the draft model with transformers' own assisted-generation
# settings (up to 20 draft tokens, stop below 0.4 confidence) side by side with hf-assisted.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/draftwise bench \
  --workload "${WORKLOAD:-humaneval:0-19}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --method dw-plain=dw:proposer=none,backend=transformers \
  --method dw-draft-k20=dw:proposer=draft-model,backend=transformers,k=20 \
  --method hf-assisted \
  --out benchmarks/transformers_draft_k20 "$@"
