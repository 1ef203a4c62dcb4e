#!/usr/bin/env bash
# Shared launcher: the Qwen pair, greedy, 128 new tokens, one repeat, 2 threads.
# Usage: qwen_bench.sh OUT_DIR --method ... [more bench flags]; WORKLOAD narrows the workload.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$1"; shift
exec .venv/bin/draftwise bench \
  --workload "${WORKLOAD:-humaneval:0-19}" \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --out "$out" "$@"
