#!/usr/bin/env bash
# Issue 4 benchmark: Qwen2.5-Coder-1.5B GGUF on llama.cpp, HumanEval 0-19, chat template,
# greedy, 128 new tokens: llama-cpp-python plain and with LlamaPromptLookupDecoding, draftwise
# llamacpp plain, prompt lookup (chain and 4-candidate tree) and the 0.5B draft model.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/draftwise bench \
  --workload "${WORKLOAD:-humaneval:0-19}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --method dw-plain=dw:proposer=none,backend=llamacpp \
  --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=llamacpp \
  --method dw-prompt-lookup-tree=dw:proposer=prompt-lookup,backend=llamacpp,candidates=4 \
  --method dw-draft=dw:proposer=draft-model,backend=llamacpp,k=6 \
  --method llamacpp-plain --method llamacpp-prompt-lookup \
  --out benchmarks/llamacpp_core "$@"
