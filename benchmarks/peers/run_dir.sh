#!/usr/bin/env bash
# Default run directory of a study, relative to the repository root:
#   benchmarks/STUDY/runs/<machine>-<YYYY-MM-DD>[-VARIANT]
# <machine> is a short CPU slug (amd-epyc, intel-xeon, else the first two words of the CPU's
# model name); the date is today's (UTC).  Usage: bash benchmarks/peers/run_dir.sh STUDY [VARIANT]
# Shared by every study's scripts (they take OUT or a directory argument to write elsewhere).
set -euo pipefail
study="${1:?usage: run_dir.sh STUDY [VARIANT]}"
model="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1 || true)"
case "$model" in
  *EPYC*) machine=amd-epyc ;;
  *Xeon*) machine=intel-xeon ;;
  "") machine="$(uname -m)" ;;
  *) machine="$(printf '%s' "$model" | sed 's/([^)]*)//g' | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' ' ' \
       | awk '{print $1 (NF > 1 ? "-" $2 : "")}')" ;;
esac
echo "benchmarks/$study/runs/$machine-$(date -u +%F)${2:+-$2}"
