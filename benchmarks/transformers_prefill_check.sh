#!/usr/bin/env bash
# Quick check of the prefill fix (the prompt's prefill gives token 1; no drafting before it):
# TTFT and tok/s of draftwise's speculative methods beside transformers' on HumanEval/0.
# The issue-2 evidence is transformers_core.sh; this only shows the first-round gap closed.
WORKLOAD="${WORKLOAD:-humaneval:0-0}" exec bash "$(dirname "$0")/qwen_bench.sh" benchmarks/transformers_prefill_check \
  --method dw-plain=dw:proposer=none,backend=transformers \
  --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=transformers \
  --method dw-draft=dw:proposer=draft-model,backend=transformers,k=20 \
  --method hf-assisted --method hf-prompt-lookup "$@"
