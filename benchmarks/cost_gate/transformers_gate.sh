#!/usr/bin/env bash
# The cost gate on the issue-2 workload: Qwen2.5-Coder-1.5B on the transformers backend,
# HumanEval 0-19, chat template, greedy, 128 new tokens.  draftwise prompt lookup with
# `gate=auto` (the target's t(1..11) is measured once, cached, before the timed problems)
# against transformers' `prompt_lookup_num_tokens=10` and plain decoding, interleaved problem
# by problem in one process.  Ungated draftwise prompt lookup ties transformers' (see
# transformers_core/): add --method dw-prompt-lookup=dw:proposer=prompt-lookup,backend=transformers
# to see it side by side (about 25 more minutes).
exec bash "$(dirname "$0")/../peers/qwen_bench.sh" "${OUT:-$(bash "$(dirname "$0")/../peers/run_dir.sh" cost_gate transformers)}" \
  --method dw-plain=dw:proposer=none,backend=transformers \
  --method dw-prompt-lookup-gate=dw:proposer=prompt-lookup,backend=transformers,gate=auto \
  --method hf-prompt-lookup "$@"
