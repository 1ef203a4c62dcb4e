#!/usr/bin/env bash
# The serving study: `draftwise serve` with speculation (--proposer auto) and without (none)
# against llama-cpp-python's own OpenAI server, all on the embedded GGUF (backend llamacpp for
# draftwise: the same file and kernels), closed loop at concurrency 1, 4, 8, one server at a time.
# OUT (or the first argument) is the run directory; resumable (run it again to continue).
# CONCURRENCY, RATES, NUM_PROMPTS, MAX_TOKENS, REPEATS, WORKLOAD, ENDPOINT, THREADS override the
# defaults.  THREADS=1 by default: on a machine whose cores other work shares, llama.cpp's 2-thread
# decode stalls at every barrier when one of its threads is descheduled (README).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-${1:-$(bash benchmarks/peers/run_dir.sh serving)}}"
.venv/bin/draftwise bench serve --servers draftwise-auto,draftwise-none,llamacpp-server \
  --concurrency "${CONCURRENCY:-1,4,8}" --rates "${RATES:-}" --num-prompts "${NUM_PROMPTS:-16}" \
  --max-tokens "${MAX_TOKENS:-64}" --repeats "${REPEATS:-2}" --workload "${WORKLOAD:-humaneval:0-79}" \
  --endpoint "${ENDPOINT:-chat}" --threads "${THREADS:-1}" --out "$out" --resume
