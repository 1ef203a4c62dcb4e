#!/usr/bin/env bash
# Issue 2 benchmark: Qwen2.5-Coder-1.5B target on the transformers backend, HumanEval 0-19,
# chat template, greedy, 128 new tokens; transformers' own generate (plain, assisted by the
# 0.5B, prompt lookup) side by side with draftwise plain, draft model and prompt lookup.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/draftwise bench \
  --workload "${WORKLOAD:-humaneval:0-19}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --method dw-plain=dw:proposer=none,backend=transformers \
  --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=transformers \
  --method dw-draft=dw:proposer=draft-model,backend=transformers,k=12 \
  --method hf-plain --method hf-assisted --method hf-prompt-lookup \
  --out benchmarks/transformers_core "$@"
