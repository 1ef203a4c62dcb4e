#!/usr/bin/env bash
# Issue 4 benchmark: the Qwen2.5-Coder-1.5B GGUF on llama.cpp, HumanEval 0-19, greedy, 128 new
# tokens: llama-cpp-python plain and with LlamaPromptLookupDecoding, draftwise llamacpp plain,
# prompt lookup (chain and 4-candidate tree) and the 0.5B draft model.
exec bash "$(dirname "$0")/qwen_bench.sh" "${OUT:-$(bash "$(dirname "$0")/run_dir.sh" peers llamacpp)}" \
  --method dw-plain=dw:proposer=none,backend=llamacpp \
  --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=llamacpp \
  --method dw-prompt-lookup-tree=dw:proposer=prompt-lookup,backend=llamacpp,candidates=4 \
  --method dw-draft=dw:proposer=draft-model,backend=llamacpp,k=6 \
  --method llamacpp-plain --method llamacpp-prompt-lookup "$@"
