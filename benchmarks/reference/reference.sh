#!/usr/bin/env bash
# Issue 3 reference run: the Qwen pair (Qwen2.5-Coder-1.5B target, 0.5B draft), greedy, 128 new
# tokens, HumanEval 0-19 and 40 Spec-Bench development questions stratified over all 13
# categories (multi-turn questions run turn by turn), every method on both backends and both
# peers, interleaved prompt by prompt in one run.  Each method's speedup is over its own
# backend's plain decoding.  About 10 hours on the 2-core CPU machine: re-run the same command
# with --resume to continue (finished (method, question) pairs are skipped).
# Prompt lookup runs with and without the cost gate (gate=auto); REST runs gated only (ungated
# it pays a whole tree verify every round: 0.24x plain on chat questions in a trial).
# REST_INDEX: the chat datastore (see benchmarks/rest_index/README.md for how it is built).
set -euo pipefail
cd "$(dirname "$0")/../.."
index="${REST_INDEX:-$HOME/.cache/draftwise/indexes/chat}"
tf="backend=transformers"
cpp="backend=llamacpp"
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD1:-humaneval:0-19}" \
  --workload "${WORKLOAD2:-spec-bench:40}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --out "${OUT:-$(bash benchmarks/peers/run_dir.sh reference)}" \
  --method tf-dw-plain=dw:proposer=none,$tf \
  --method tf-dw-prompt-lookup=dw:proposer=prompt-lookup,$tf \
  --method tf-dw-prompt-lookup-gate=dw:proposer=prompt-lookup,$tf,gate=auto \
  --method tf-dw-draft=dw:proposer=draft-model,$tf,k=20 \
  --method hf-plain --method hf-assisted --method hf-prompt-lookup \
  --method cpp-dw-plain=dw:proposer=none,$cpp \
  --method cpp-dw-prompt-lookup=dw:proposer=prompt-lookup,$cpp \
  --method cpp-dw-prompt-lookup-gate=dw:proposer=prompt-lookup,$cpp,gate=auto \
  --method cpp-dw-prompt-lookup-tree=dw:proposer=prompt-lookup,$cpp,candidates=4 \
  --method cpp-dw-draft=dw:proposer=draft-model,$cpp,k=6 \
  --method cpp-dw-rest-gate=dw:proposer=rest,$cpp,index=$index,gate=auto \
  --method llamacpp-plain --method llamacpp-prompt-lookup "$@"
