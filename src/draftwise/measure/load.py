"""Loading a backend for a model name: which backend runs it, with which threads, dtype and
kernels, and the measurements that configure it (dtype auto, strict kernels, row padding).  The
one loader every layer uses (planning, training, the CLI, the bench)."""

from __future__ import annotations

import os
from typing import Callable, cast

from draftwise.backends.base import Backend, StrictScope
from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice, TorchDtype, check_dtype
from draftwise.backends.load import choose_backend
from draftwise.errors import InputError
from draftwise.measure import auto_cache_root
from draftwise.models import resolve

# (model name, backend name, role "target" or "draft") -> a loaded backend
Loader = Callable[[str, str, str], Backend]


def load_backend(model_name: str, backend: str = "auto", threads: int | None = None, device: str = "cpu",
                 dtype: DtypeChoice = DEFAULT_DTYPE, strict: StrictScope | None = None, pad_rows: bool = True) -> Backend:
    """A backend for `model_name`; it sizes its own per-round resources when a decoder starts.
    `dtype` is the transformers backend's (float32, bfloat16, or auto: the faster here, measured
    once and cached); llama.cpp runs the GGUF's own types and takes only the default.  `strict`
    ("chains" or "trees"): llama.cpp with the kernels whose verify rows of that shape are
    bit-identical to plain decoding's, capped at the rows the invariance probe measured exact
    (probed on first use, cached).  `pad_rows`: transformers verify forwards padded to the row
    count measured fastest on this machine (`measure/row_padding.py`; measured once, cached)."""
    check_dtype(dtype)  # before anything is loaded
    model = resolve(model_name)
    kind = choose_backend(backend, model)
    if strict and kind != "llamacpp":
        raise InputError(f"strict chooses the llama.cpp backend's kernels; {model_name!r} runs on {kind}")
    if strict:
        from draftwise.measure.invariance import load_strict

        return load_strict(model, threads, scope=strict)
    if kind == "llamacpp":
        if model.kind != "gguf":
            raise InputError(f"the llamacpp backend loads .gguf models; {model_name!r} is a {model.kind}")
        if dtype != DEFAULT_DTYPE:
            raise InputError(f"dtype {dtype} configures the transformers backend; llama.cpp computes in the GGUF's "
                             "own types (pass --backend transformers, or leave dtype at its default)")
        from draftwise.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend.load(model, n_threads=threads)
    import torch

    from draftwise.backends.transformers import TransformersBackend

    if threads:
        torch.set_num_threads(threads)
    if dtype == "auto":
        from draftwise.measure.dtype import choose_dtype

        chosen, _ = choose_dtype(lambda d: TransformersBackend.load(model, device=device, dtype=cast(TorchDtype, d)),
                                 model.checkpoint_id, torch.get_num_threads(), device)
        assert isinstance(chosen, TransformersBackend)
        loaded = chosen
    else:
        loaded = TransformersBackend.load(model, device=device, dtype=dtype)
    if pad_rows:
        from draftwise.measure.row_padding import row_padding_for

        loaded.row_padding = row_padding_for(loaded, auto_cache_root())
    return loaded


def default_threads() -> int:
    return os.cpu_count() or 1


def default_loader(threads: int | None = None, device: str = "cpu", dtype: DtypeChoice = DEFAULT_DTYPE,
                   strict: StrictScope | None = None) -> Loader:
    """`load_backend` with a decoder's settings; `strict` is the target's: a draft's rows only
    choose candidates, never what is published."""
    def load(model: str, backend: str, role: str) -> Backend:
        return load_backend(model, backend, threads, device=device, dtype=dtype,
                            strict=strict if role == "target" else None)
    return load
