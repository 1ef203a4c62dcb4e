#!/usr/bin/env bash
# Issue 6 decoding benchmark: REST vs plain decoding vs prompt lookup on the Qwen pair, greedy,
# 128 new tokens, in two runs: HumanEval 0-19 with the code datastore, and the Spec-Bench
# development split (all categories) with the chat datastore; prompt lookup and REST each with and
# without the cost gate.  BACKEND picks the backend
# (default llamacpp, the fastest plain decoder on this machine); WORKLOAD_CODE / WORKLOAD_CHAT
# narrow the workloads (e.g. spec-bench:40 for 40 stratified questions of the packaged Spec-Bench split); RUNS picks the runs
# (default "code chat"); extra flags (e.g. --resume) go to every run.  Indexes: see benchmarks/rest_index/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
backend="${BACKEND:-llamacpp}"
indexes="${REST_INDEXES:-$HOME/.cache/draftwise/indexes}"
run() {  # run OUT WORKLOAD INDEX [flags]
  local out="$1" workload="$2" index="$3"; shift 3
  .venv/bin/draftwise bench --workload "$workload" \
    --target qwen2.5-coder-1.5b --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
    --out "$out" \
    --method plain=dw:proposer=none,backend=$backend \
    --method prompt-lookup=dw:proposer=prompt-lookup,backend=$backend \
    --method prompt-lookup-gate=dw:proposer=prompt-lookup,backend=$backend,gate=auto \
    --method rest=dw:proposer=rest,backend=$backend,index=$index \
    --method rest-gate=dw:proposer=rest,backend=$backend,index=$index,gate=auto "$@"
}
for which in ${RUNS:-code chat}; do
  case "$which" in
    code) run "${OUT_CODE:-$(bash benchmarks/peers/run_dir.sh rest_decoding code-$backend)}" "${WORKLOAD_CODE:-humaneval:0-19}" "$indexes/code" "$@" ;;
    chat) run "${OUT_CHAT:-$(bash benchmarks/peers/run_dir.sh rest_decoding chat-$backend)}" \
            "${WORKLOAD_CHAT:-spec-bench}" "$indexes/chat" "$@" ;;
    *) echo "RUNS: unknown run '$which' (expected code and/or chat)" >&2; exit 2 ;;
  esac
done
