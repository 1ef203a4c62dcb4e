#!/usr/bin/env bash
# Issue 46 item 4's speed check: a Hydra++ head set at its best tree (tree=auto) beside plain
# decoding, prompt lookup + gate and the gated union of prompt lookup and the same heads, greedy,
# 128 new tokens, interleaved question by question in ONE run (heads_smollm2's workload: one
# Spec-Bench dev question per category + HumanEval 2-11; tree=auto calibrates on HumanEval 0-1).
# HEADS: the set measured (default: the shipped one, trained on the grown corpus by train_10x.sh);
# PREVIOUS: another set measured beside it (the 2026-12-06 run: the set shipped before, from git
# history: `git show d670172~1:src/draftwise/data/heads/hydra++-smollm2-135m/heads.safetensors` and its manifest.json).
# Usage: [HEADS=dir] [PREVIOUS=dir] [BACKEND=transformers] [REPEATS=1] bash bench_10x.sh OUT_DIR [bench flags, e.g. --resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: bench_10x.sh OUT_DIR}"
shift
backend="${BACKEND:-transformers}"
heads="${HEADS:-src/draftwise/data/heads/hydra++-smollm2-135m}"
previous=()
if [ -n "${PREVIOUS:-}" ]; then
  previous=(--method "dw-hydrapp-previous-auto=dw:proposer=hydra++,heads=$PREVIOUS,backend=$backend,tree=auto")
fi
exec .venv/bin/draftwise bench --workload "spec-bench:all:13" --workload "humaneval:2-11" --target smollm2-135m \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats "${REPEATS:-1}" --threads 2 --out "$out" \
  --method "dw-plain=dw:proposer=none,backend=$backend" \
  --method "dw-lookup-gate=dw:proposer=prompt-lookup,backend=$backend,gate=auto" \
  "${previous[@]}" \
  --method "dw-hydrapp-auto=dw:proposer=hydra++,heads=$heads,backend=$backend,tree=auto" \
  --method "dw-union-gate=dw:proposer=prompt-lookup+hydra++,heads=$heads,backend=$backend,gate=auto" \
  "$@"
