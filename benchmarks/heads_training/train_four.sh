#!/usr/bin/env bash
# Issue 28's Qwen heads: the four families on ONE self-distilled data set (the recipe of this
# folder's README: 192 ShareGPT prompts, 96 answer tokens), EPOCHS epochs each, into the cache
# where `--proposer <family>` finds them for qwen2.5-coder-1.5b.  Medusa runs first on both
# cores and builds the hidden-state cache on the way; the other three then train two at a
# time, one thread each.  Logs: $LOGS/<family>.log.   Usage: [EPOCHS=8] bash train_four.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/heads_training/corpus.sh
logs="${LOGS:-benchmarks/heads_training/logs}"
mkdir -p "$logs"
train() {  # family threads preset-or-options...
  local family="$1" threads="$2"; shift 2
  .venv/bin/draftwise heads train --family "$family" "${qwen_corpus[@]}" --threads "$threads" "$@" > "$logs/$family.log" 2>&1
}
train medusa 2 --preset medusa-1
# the shipped embedded-model recipes: Hydra++ = 3 layers + teacher loss only; Clover without
# the augmenting block (../heads_ii_training/table.md: the options that paid at this data size)
( train hydra++ 1 --set layers=3 --set teacher_weight=1 --set hard_weight=0 && train hydra 1 --preset hydra ) &
lane=$!
train clover 1 --set layers=1
wait "$lane"
