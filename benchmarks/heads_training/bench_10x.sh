#!/usr/bin/env bash
# Issue 46 item 4's speed check: the shipped Hydra++ heads and the ones trained on the grown
# corpus (train_10x.sh), each at its best tree (tree=auto), beside plain decoding, prompt lookup
# + gate and the union of prompt lookup and the new heads (gated), greedy, 128 new tokens,
# interleaved question by question in ONE run (heads_smollm2's workload: one Spec-Bench dev
# question per category + HumanEval 2-11; tree=auto calibrates on HumanEval 0-1).
# Usage: [NEW=dir] [SHIPPED=dir] [BACKEND=transformers] bash bench_10x.sh OUT_DIR [bench flags, e.g. --resume]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: bench_10x.sh OUT_DIR}"
shift
backend="${BACKEND:-transformers}"
new="${NEW:-$HOME/.cache/draftwise/heads-10x/hydra++-smollm2-135m}"
shipped="${SHIPPED:-src/draftwise/data/heads/hydra++-smollm2-135m}"
exec .venv/bin/draftwise bench --workload "spec-bench:all:13" --workload "humaneval:2-11" --target smollm2-135m \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats "${REPEATS:-1}" --threads 2 --out "$out" \
  --method "dw-plain=dw:proposer=none,backend=$backend" \
  --method "dw-lookup-gate=dw:proposer=prompt-lookup,backend=$backend,gate=auto" \
  --method "dw-hydrapp-shipped-auto=dw:proposer=hydra++,heads=$shipped,backend=$backend,tree=auto" \
  --method "dw-hydrapp-10x-auto=dw:proposer=hydra++,heads=$new,backend=$backend,tree=auto" \
  --method "dw-union-10x-gate=dw:proposer=prompt-lookup+hydra++,heads=$new,backend=$backend,gate=auto" \
  "$@"
