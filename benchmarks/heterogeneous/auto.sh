#!/usr/bin/env bash
# Issue 46's check of `--proposer auto` (behind its do-no-harm guard) against plain decoding:
# 13 Spec-Bench development questions (one per category, both turns) + HumanEval 0-3, SmolLM2-135M,
# 128 new tokens, 2 threads, 2 interleaved repeats (REPEATS), in ONE run.  auto calibrates on its default
# prompts (HumanEval 0-1 + the packaged chat-calibration requests), none of them in this workload.
# Usage: [BACKEND=transformers|llamacpp] [TEMPERATURE=0] [REPEATS=2] [TARGET=smollm2-135m] [DRAFT=qwen2.5-coder-0.5b] bash benchmarks/heterogeneous/auto.sh OUT_DIR [bench flags, e.g. --resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: auto.sh OUT_DIR}"
shift
backend="${BACKEND:-transformers}"
draft=()  # a draft model among auto's candidates (the Qwen pair's 0.5B)
if [ -n "${DRAFT:-}" ]; then draft=(--draft "$DRAFT"); fi
exec .venv/bin/draftwise bench --workload spec-bench:13 --workload humaneval:0-3 --target "${TARGET:-smollm2-135m}" "${draft[@]}" \
  --max-new-tokens 128 --temperature "${TEMPERATURE:-0}" --seed 0 --repeats "${REPEATS:-2}" --threads 2 --out "$out" \
  --method "plain=dw:proposer=none,backend=$backend" \
  --method "auto=dw:proposer=auto,backend=$backend" \
  "$@"
