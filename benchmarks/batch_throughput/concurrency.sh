#!/usr/bin/env bash
# Issue 43's check with B requests in flight (closed loop): plain batched decoding, fixed-depth
# prompt lookup (guard=false) and the batch-aware gate behind the batch's do-no-harm guard, on
# 16 HumanEval first turns, 64 new tokens, 2 threads, 2 interleaved repeats, in ONE run.
# Usage: [BACKEND=transformers|llamacpp] [TARGET=smollm2-135m|qwen2.5-coder-1.5b] [CONCURRENCY=2,8]
#        bash benchmarks/batch_throughput/concurrency.sh OUT_DIR [bench flags, e.g. --resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: concurrency.sh OUT_DIR}"
shift
backend="${BACKEND:-transformers}"
# llama.cpp: the lookup settings its gate was tuned with (a chain of up to 10 from a 2-gram match)
lookup=""
if [ "$backend" = llamacpp ]; then lookup=",lookup=10,ngram=2,candidates=1"; fi
exec .venv/bin/draftwise bench --workload humaneval:0-15 --target "${TARGET:-smollm2-135m}" --max-new-tokens 64 \
  --threads 2 --repeats 2 --concurrency "${CONCURRENCY:-2,8}" --out "$out" \
  --method "plain=dw:proposer=none,backend=$backend" \
  --method "lookup=dw:proposer=prompt-lookup,backend=$backend$lookup,guard=false" \
  --method "lookup-gate=dw:proposer=prompt-lookup,backend=$backend$lookup,gate=auto,batch=8" \
  "$@"
