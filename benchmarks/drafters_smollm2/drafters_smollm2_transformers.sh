#!/usr/bin/env bash
# Issues 28-29 first side-by-side: every head family (Medusa, Hydra, Hydra++, Clover, the
# committed sets) and both self-drafters (Draft & Verify with the every-other-layer rule and
# adaptive gamma; Kangaroo chain and tree with the committed adapter) against plain decoding and
# prompt lookup + gate, on the embedded model, transformers backend, greedy, 96 new tokens,
# HumanEval 0-4 + the first 5 Spec-Bench development questions, one run, 2 threads.  Each family
# at its defaults (a chain through every head; no searched tree): the trees, the searched skip
# set and the Qwen target are the full benchmark's.  About 15 minutes alone; --resume continues.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$(bash benchmarks/peers/run_dir.sh drafters_smollm2 transformers)}"
tf="backend=transformers"
.venv/bin/draftwise bench \
  --workload humaneval:0-4 --workload spec-bench:5 \
  --target smollm2-135m --max-new-tokens 96 --temperature 0 --seed 0 --repeats 1 --threads 2 \
  --out "$out" \
  --method plain=dw:proposer=none,$tf \
  --method lookup-gate=dw:proposer=prompt-lookup,$tf,gate=auto \
  --method medusa=dw:proposer=medusa,$tf \
  --method hydra=dw:proposer=hydra,$tf \
  --method hydra-pp=dw:proposer=hydra++,$tf \
  --method clover=dw:proposer=clover,$tf \
  --method layer-skip=dw:proposer=layer-skip,$tf,skip=every-other \
  --method kangaroo=dw:proposer=kangaroo,$tf \
  --method kangaroo-tree=dw:proposer=kangaroo,$tf,tree=wbd:2,2,1 "$@"
