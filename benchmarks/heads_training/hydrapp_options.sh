#!/usr/bin/env bash
# Issue 28: Hydra++'s options one at a time on the Qwen data set of train_four.sh (same corpus
# recipe, same epochs), written outside the cache so the shipped-recipe sets stay in use.  Two
# lanes, one thread each.  Then: collect.py --json benchmarks/heads_training/runs/<machine>-<date>-qwen-hydrapp-options/hydrapp_options.json
# NAME=OUT/NAME ... > benchmarks/heads_training/runs/<machine>-<date>-qwen-hydrapp-options/hydrapp_options.md
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/heads_training/corpus.sh
out="${OUT:-$HOME/.cache/draftwise/heads-experiments/qwen2.5-coder-1.5b}"
logs="${LOGS:-benchmarks/heads_training/logs}"
mkdir -p "$logs" "$out"
train() {  # name options...
  local name="$1"; shift
  .venv/bin/draftwise heads train --family hydra++ "${qwen_corpus[@]}" --threads 1 --out "$out/$name" "$@" > "$logs/$name.log" 2>&1
}
( train deeper-only --set layers=4 && train teacher-only --set layers=1 --set teacher_weight=1 --set hard_weight=0 ) &
lane=$!
train prefix-only --set layers=1 --set prefix=true
train three-layers-mixed --set layers=3 --set teacher_weight=0.5 --set hard_weight=0.5
wait "$lane"
