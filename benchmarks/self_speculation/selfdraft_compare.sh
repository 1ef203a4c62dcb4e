#!/usr/bin/env bash
# Issue 29's benchmark: self-speculation beside plain decoding, prompt lookup + gate and (with a
# draft model of the target's family) the draft model, interleaved question by question in ONE
# run on the transformers backend, greedy, 128 new tokens.  Usage:
#   TARGET=smollm2-135m|qwen2.5-coder-1.5b SKIP=<skip search dir> [DRAFT=qwen2.5-coder-0.5b] \
#     [GAMMAS="0.2 0.4 0.6 0.8"] [DV_OPTS=,k=4] [WORKLOAD_CHAT=...] [WORKLOAD_CODE=...] [MAX_NEW=128] \
#     bash benchmarks/self_speculation/selfdraft_compare.sh [OUT_DIR] [bench flags, e.g. --resume]
# Draft & Verify runs the searched skip set with adaptive gamma, the every-other-layer rule
# (the same number of sublayers when the search was run with size=L) with adaptive gamma, and
# the searched set at each fixed gamma of GAMMAS (GAMMAS=" ": no grid), each with DV_OPTS appended
# (the drafter settings the search ran with, e.g. ",k=4"); Kangaroo runs the adapter bound to the target
# (the committed one for the embedded model, the cache's for Qwen) as a chain and as a tree.
# The skip search's development prompts (benchmarks/self_speculation/dev_questions.jsonl: the second
# question of six Spec-Bench categories) are disjoint from this workload (the first question of
# each category, HumanEval).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(bash benchmarks/peers/run_dir.sh self_speculation "${TARGET:-smollm2-135m}")}"
[ $# -gt 0 ] && shift
tf="backend=transformers"
methods=(--method "plain=dw:proposer=none,$tf"
         --method "lookup-gate=dw:proposer=prompt-lookup,$tf,gate=auto")
[ -n "${DRAFT:-}" ] && methods+=(--method "draft-k20=dw:proposer=draft-model,$tf,k=20")
methods+=(--method "dv-searched=dw:proposer=layer-skip,$tf,skip=${SKIP:?SKIP: a skip search directory}${DV_OPTS:-}"
          --method "dv-every-other=dw:proposer=layer-skip,$tf,skip=every-other${DV_OPTS:-}")
for gamma in ${GAMMAS:-0.2 0.4 0.6 0.8}; do
  methods+=(--method "dv-searched-g${gamma/./}=dw:proposer=layer-skip,$tf,skip=$SKIP,adaptive=false,gamma=$gamma${DV_OPTS:-}")
done
methods+=(--method "kangaroo=dw:proposer=kangaroo,$tf"
          --method "kangaroo-tree=dw:proposer=kangaroo,$tf,tree=wbd:2,2,1")
draft_flag=()
[ -n "${DRAFT:-}" ] && draft_flag=(--draft "$DRAFT")
exec .venv/bin/draftwise bench --workload "${WORKLOAD_CHAT:-spec-bench:all:13}" --workload "${WORKLOAD_CODE:-humaneval:0-4}" \
  --target "${TARGET:-smollm2-135m}" "${draft_flag[@]}" --max-new-tokens "${MAX_NEW:-128}" --temperature 0 --seed 0 \
  --repeats 1 --threads 2 --out "$out" "${methods[@]}" "$@"
