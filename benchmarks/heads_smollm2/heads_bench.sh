#!/usr/bin/env bash
# Issue 27's head benchmark: plain decoding, prompt lookup + cost gate, the peers' prompt
# lookup, and the Medusa and Hydra heads (each with its best tree by tree=auto; Hydra's chain
# with a confidence cut, and under the cost gate), greedy, 128 new tokens, interleaved question by question in ONE
# run per backend.  Usage:
#   BACKEND=transformers|llamacpp [TARGET=smollm2-135m] [WORKLOAD="..."] bash benchmarks/heads_smollm2/heads_bench.sh [OUT_DIR] [bench flags, e.g. --resume]
# The default workload is narrowed for a 2-core CPU session: one Spec-Bench development
# question per category (13 questions, 21 turns) and HumanEval 2-11 (the auto trees calibrate on HumanEval 0-1, the default calibration workload).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(bash benchmarks/peers/run_dir.sh heads_smollm2 "${BACKEND:-transformers}")}"
[ $# -gt 0 ] && shift
backend="${BACKEND:-transformers}"
target="${TARGET:-smollm2-135m}"
workload=(--workload "${WORKLOAD_CHAT:-spec-bench:all:13}" --workload "${WORKLOAD_CODE:-humaneval:2-11}")
if [ "$backend" = transformers ]; then
  peers=(--method hf-prompt-lookup)
else
  peers=(--method llamacpp-prompt-lookup)
fi
extra=()
if [ -n "${DRAFT:-}" ]; then
  extra=(--draft "$DRAFT" --method "dw-draft-model=dw:proposer=draft-model,backend=$backend,tree=auto")
fi
exec .venv/bin/draftwise bench "${workload[@]}" --target "$target" \
  --max-new-tokens 128 --temperature 0 --seed 0 --repeats 1 --threads 2 --out "$out" \
  --method "dw-plain=dw:proposer=none,backend=$backend" \
  --method "dw-prompt-lookup-gate=dw:proposer=prompt-lookup,backend=$backend,gate=auto" \
  "${peers[@]}" \
  --method "dw-medusa-auto=dw:proposer=medusa,backend=$backend,tree=auto" \
  --method "dw-hydra-auto=dw:proposer=hydra,backend=$backend,tree=auto" \
  --method "dw-hydra-conf=dw:proposer=hydra,backend=$backend,confidence=0.4" \
  --method "dw-hydra-gate=dw:proposer=hydra,backend=$backend,gate=auto" \
  "${extra[@]}" "$@"
