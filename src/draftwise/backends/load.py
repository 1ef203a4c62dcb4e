"""Which backend runs a model name, and a loaded backend opened as a batch (of requests, or of
a draft model's steps).  Loading one, with the measurements that configure it, is
`draftwise.measure.load.load_backend`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftwise.backends.base import Backend
from draftwise.errors import InputError
from draftwise.models import ResolvedModel

if TYPE_CHECKING:
    from draftwise.backends.batch import BatchBackend, DraftBatch

BACKENDS = ("auto", "transformers", "llamacpp")


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
