#!/usr/bin/env bash
# The cost gate on llama.cpp, where verify cost grows nearly linearly with rows (t(2) ~1.3-1.6
# plain steps): Qwen2.5-Coder-1.5B Q4_K_M, HumanEval 0-19, greedy, 128 new tokens.  draftwise
# plain and prompt lookup with and without `gate=auto` against llama-cpp-python's
# LlamaPromptLookupDecoding, interleaved problem by problem in one process.  The committed
# results are WORKLOAD=humaneval:0-9 (about 12 minutes).
exec bash "$(dirname "$0")/../peers/qwen_bench.sh" "${OUT:-$(bash "$(dirname "$0")/../peers/run_dir.sh" cost_gate llamacpp)}" \
  --method dw-plain=dw:proposer=none,backend=llamacpp \
  --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=llamacpp \
  --method dw-prompt-lookup-gate=dw:proposer=prompt-lookup,backend=llamacpp,gate=auto \
  --method llamacpp-prompt-lookup "$@"
