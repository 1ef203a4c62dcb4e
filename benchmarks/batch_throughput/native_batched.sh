#!/usr/bin/env bash
# llama.cpp's own batched decoding (`llama-batched-bench`) beside draftwise's plain multi-sequence
# decode (native_batched.py).  The tool is built once from the llama.cpp source vendored in the
# installed llama-cpp-python's sdist (same version, same -march=native without AMX as
# scripts/setup.sh), cached under ${DRAFTWISE_CACHE:-~/.cache/draftwise}/llama-batched-bench/VERSION.
#   bash benchmarks/batch_throughput/native_batched.sh OUT_DIR [native_batched.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: native_batched.sh OUT_DIR [options]}"
shift
py=.venv/bin/python
version=$($py -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
home="${DRAFTWISE_CACHE:-$HOME/.cache/draftwise}/llama-batched-bench/$version"
tool="$home/build/bin/llama-batched-bench"
if [ ! -x "$tool" ]; then
  mkdir -p "$home"
  if [ ! -d "$home/llama.cpp" ]; then
    echo "fetching the llama-cpp-python $version source (its vendored llama.cpp)" >&2
    $py -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$home/sdist"
    tar xzf "$home/sdist/llama_cpp_python-$version.tar.gz" -C "$home" "llama_cpp_python-$version/vendor/llama.cpp"
    mv "$home/llama_cpp_python-$version/vendor/llama.cpp" "$home/llama.cpp"
    rm -rf "$home/llama_cpp_python-$version" "$home/sdist"
  fi
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  echo "building llama-batched-bench (a few minutes on 2 cores)" >&2
  cmake -S "$home/llama.cpp" -B "$home/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >/dev/null
  cmake --build "$home/build" --target llama-batched-bench -j "$(nproc)" >/dev/null
fi
PYTHONPATH=src $py benchmarks/batch_throughput/native_batched.py --tool "$tool" --out "$out" "$@"
