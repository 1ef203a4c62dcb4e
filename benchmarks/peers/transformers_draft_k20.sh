#!/usr/bin/env bash
# Supplement to transformers_core.sh: the draft model with transformers' own assisted-generation
# settings (up to 20 draft tokens, stop after a token under 0.4 confidence) beside hf-assisted.
exec bash "$(dirname "$0")/qwen_bench.sh" "${OUT:-$(bash "$(dirname "$0")/run_dir.sh" peers transformers-draft-k20)}" \
  --method dw-plain=dw:proposer=none,backend=transformers \
  --method dw-draft-k20=dw:proposer=draft-model,backend=transformers,k=20 \
  --method hf-assisted "$@"
