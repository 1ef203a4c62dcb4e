"""Loading a backend for a model name: which backend runs it, with which threads, dtype and
kernels.  The one loader every layer uses (planning, building, training, the CLI, the bench)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, cast

from draftwise.backends.base import Backend
from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice, TorchDtype, check_dtype
from draftwise.errors import InputError
from draftwise.models import ResolvedModel, resolve

if TYPE_CHECKING:
    from draftwise.backends.batch import BatchBackend, DraftBatch
    from draftwise.backends.invariance import StrictScope

BACKENDS = ("auto", "transformers", "llamacpp")

# (model name, backend name, role "target" or "draft") -> a loaded backend
Loader = Callable[[str, str, str], Backend]


def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(name: str, model: ResolvedModel) -> str:
    """`auto`: llama.cpp for GGUF files when llama-cpp-python is installed, else transformers."""
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    return "llamacpp" if model.kind == "gguf" and llamacpp_available() else "transformers"


def load_backend(model_name: str, backend: str = "auto", threads: int | None = None, device: str = "cpu",
                 dtype: DtypeChoice = DEFAULT_DTYPE, strict: StrictScope | None = None, pad_rows: bool = True) -> Backend:
    """A backend for `model_name`; it sizes its own per-round resources when a decoder starts.
    `dtype` is the transformers backend's (float32, bfloat16, or auto: the faster here, measured
    once and cached); llama.cpp runs the GGUF's own types and takes only the default.  `strict`
    ("chains" or "trees"): llama.cpp with the kernels whose verify rows of that shape are
    bit-identical to plain decoding's, capped at the rows the invariance probe measured exact
    (probed on first use, cached).  `pad_rows`: transformers verify forwards padded to the row
    count measured fastest on this machine (`backends/row_padding.py`; measured once, cached)."""
    check_dtype(dtype)  # before anything is loaded
    model = resolve(model_name)
    kind = choose_backend(backend, model)
    if strict and kind != "llamacpp":
        raise InputError(f"strict chooses the llama.cpp backend's kernels; {model_name!r} runs on {kind}")
    if strict:
        from draftwise.backends.invariance import load_strict

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
        from draftwise.backends.dtype import choose_dtype

        chosen, _ = choose_dtype(lambda d: TransformersBackend.load(model, device=device, dtype=cast(TorchDtype, d)),
                                 model.checkpoint_id, torch.get_num_threads(), device)
        assert isinstance(chosen, TransformersBackend)
        loaded = chosen
    else:
        loaded = TransformersBackend.load(model, device=device, dtype=dtype)
    if pad_rows:
        from draftwise.backends.dtype import default_cache_root
        from draftwise.backends.row_padding import row_padding_for

        loaded.row_padding = row_padding_for(loaded, default_cache_root())
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


def draft_batch(draft: Backend, max_slots: int) -> DraftBatch:
    """The draft model as a batch: one slot per request (a draft model's KV follows its request's
    text, so requests cannot share one), every request's draft step in one forward."""
    from draftwise.backends.transformers import TransformersBackend
    from draftwise.backends.transformers_batch import TransformersBatch

    if draft.info.name == "llamacpp":
        from draftwise.backends.llamacpp import LlamaCppBackend, LlamaCppBatch

        assert isinstance(draft, LlamaCppBackend)
        return LlamaCppBatch.from_backend(draft, max_slots)
    if not isinstance(draft, TransformersBackend):
        raise InputError(f"a draft model drafts for the requests of a batch on the transformers and llama.cpp "
                         f"backends, not {draft.info.name}: decode these requests one at a time, or batch them "
                         "with prompt-lookup")
    from draftwise.backends.layer_skip import LayerSkipBackend, LayerSkipBatch

    if isinstance(draft, LayerSkipBackend):  # a composed pass batches as itself, not as the model it skips in
        return LayerSkipBatch(draft, max_slots)
    return TransformersBatch.from_backend(draft, max_slots)


def open_batch(target: Backend, max_slots: int) -> BatchBackend:
    """A batch backend on `target`'s loaded model: up to `max_slots` requests, each with its own KV."""
    if max_slots < 1:
        raise InputError(f"a batch holds at least 1 request, not {max_slots}")
    if target.info.name == "llamacpp":
        from draftwise.backends.llamacpp import LlamaCppBackend, LlamaCppBatch

        assert isinstance(target, LlamaCppBackend)
        return LlamaCppBatch.from_backend(target, max_slots)
    from draftwise.backends.transformers import TransformersBackend
    from draftwise.backends.transformers_batch import TransformersBatch

    if not isinstance(target, TransformersBackend):
        raise InputError(f"batched decoding runs on the transformers and llama.cpp backends, not {target.info.name}")
    return TransformersBatch.from_backend(target, max_slots)
