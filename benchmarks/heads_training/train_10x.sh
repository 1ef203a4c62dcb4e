#!/usr/bin/env bash
# Issue 46 item 4: the embedded model's heads on a grown corpus.  The shipped recipe's draw
# (prompts=640 validation=64 shortest=352: the same validation conversations) plus CODE code
# conversations and EXTRA other ones from ShareGPT (training only), self-distilled in one
# resumable pass (chunks of 32 answers; rerun to resume, or cut EXTRA to a multiple of 128 to
# keep the groups already answered), then Hydra++ (the shipped recipe) and, with HYDRA=1, Hydra,
# EPOCHS epochs each, and both scored beside the shipped sets on the same validation split.
# Usage: [CODE=1024] [EXTRA=1536] [EPOCHS=1] [HYDRA=0] bash train_10x.sh RUN_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
run="${1:?usage: train_10x.sh RUN_DIR}"
logs="${LOGS:-benchmarks/heads_training/logs}"
work="${WORK:-$HOME/.cache/draftwise/heads-data/smollm2-135m-10x}"
out="${OUT:-$HOME/.cache/draftwise/heads-10x}"
mkdir -p "$logs" "$run"
corpus=(--set prompts=640 --set validation=64 --set shortest=352 --set "code_prompts=${CODE:-1024}"
        --set "extra_prompts=${EXTRA:-1536}" --set "epochs=${EPOCHS:-1}" --work "$work" --threads 2)
nice -n 19 .venv/bin/draftwise heads train --family hydra++ --preset hydra --set layers=3 --set teacher_weight=1 \
  --set hard_weight=0 "${corpus[@]}" --out "$out/hydra++-smollm2-135m" > "$logs/10x-hydrapp.log" 2>&1
sets=("hydra++ shipped=src/draftwise/data/heads/hydra++-smollm2-135m" "hydra++ new=$out/hydra++-smollm2-135m")
if [[ "${HYDRA:-0}" == 1 ]]; then
  nice -n 19 .venv/bin/draftwise heads train --family hydra --preset hydra "${corpus[@]}" \
    --out "$out/hydra-smollm2-135m" > "$logs/10x-hydra.log" 2>&1
  sets+=("hydra shipped=src/draftwise/data/heads/hydra-smollm2-135m" "hydra new=$out/hydra-smollm2-135m")
fi
OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/heads_training/compare_sets.py --stream "$work/stream" \
  --json "$run/compare.json" "${sets[@]}" > "$run/compare.md"
