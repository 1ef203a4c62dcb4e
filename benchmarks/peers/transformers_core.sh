#!/usr/bin/env bash
# Issue 2 benchmark: Qwen2.5-Coder-1.5B on the transformers backend, HumanEval 0-19, chat
# template, greedy, 128 new tokens: transformers' own generate (plain, assisted by the 0.5B,
# prompt lookup) side by side with draftwise plain, draft model and prompt lookup. The draft
# model uses transformers' assisted-generation defaults (up to 20 tokens, 0.4 confidence stop)
# so the two draft methods differ only in the engine.
exec bash "$(dirname "$0")/qwen_bench.sh" "${OUT:-$(bash "$(dirname "$0")/run_dir.sh" peers transformers)}" \
  --method dw-plain=dw:proposer=none,backend=transformers \
  --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=transformers \
  --method dw-draft=dw:proposer=draft-model,backend=transformers,k=20 \
  --method hf-plain --method hf-assisted --method hf-prompt-lookup "$@"
