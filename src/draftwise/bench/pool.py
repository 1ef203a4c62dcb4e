"""Models loaded once per benchmark run and shared by every method that names them.

Sharing is the point: the transformers peers call `generate` on the very model object that
draftwise's transformers methods verify with, so weights, dtype and threads are the same.
A load that fails is remembered with its reason, so every method needing it is skipped
with that reason instead of retrying.
"""

from __future__ import annotations

from typing import Callable

from draftwise.backends.base import Backend
from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice
from draftwise.errors import ModelError
from draftwise.build import load_backend

LOAD_ERRORS = (ImportError, OSError, ValueError, RuntimeError)
LLAMA_N_CTX = 4096  # the draftwise llama.cpp backend's default context, so both see the same window


class ModelUnavailable(ModelError, RuntimeError):
    """A model or runtime that could not be loaded; the message is the reason."""


class ModelPool:
    def __init__(self, threads: int, seed: int, progress: Callable[[str], None] | None = None,
                 dtype: DtypeChoice = DEFAULT_DTYPE) -> None:
        self.threads = threads
        self.seed = seed
        self.dtype = dtype  # of every transformers model: draftwise methods and the peers run one object
        self._say = progress or (lambda message: None)
        self._loaded: dict[tuple, object] = {}
        self._failed: dict[tuple, str] = {}

    def say(self, message: str) -> None:
        """Progress for the run's console (model loads, what an automatic method chose)."""
        self._say(message)

    def backend(self, model: str, kind: str, role: str = "target", strict: bool = False) -> Backend:
        """A draftwise backend ('transformers' or 'llamacpp') for `model`.  Targets and drafts are
        separate objects even for the same model: a backend holds one KV cache, and a draft
        sharing its target's cache would overwrite the rows the target is verifying against.
        Each backend sizes its per-round resources itself when a decoder starts."""
        dtype = self.dtype if kind == "transformers" else DEFAULT_DTYPE  # llama.cpp runs the GGUF's own types
        strict = strict and role == "target"  # a draft's rows only choose candidates
        return self._get(("backend", model, kind, role) + (("strict",) if strict else ()),
                         lambda: load_backend(model, kind, self.threads, dtype=dtype, strict=strict))

    def llama(self, model: str, lookup_tokens: int | None) -> object:
        """llama-cpp-python's high-level `Llama`; with `lookup_tokens` it carries LlamaPromptLookupDecoding.
        Two objects, not one: a draft model makes `Llama` keep logits for every row (logits_all),
        which is fixed when the context is created."""
        return self._get(("llama", model, lookup_tokens), lambda: self._load_llama(model, lookup_tokens))

    def loaded(self) -> list[tuple]:
        return list(self._loaded)

    def _get(self, key: tuple, load: Callable[[], object]):
        if key in self._failed:
            raise ModelUnavailable(self._failed[key])
        if key not in self._loaded:
            self._say(f"loading {key[1]} ({' '.join(str(k) for k in key[2:] if k)})")
            try:
                self._loaded[key] = load()
            except LOAD_ERRORS as exc:
                self._failed[key] = f"{key[0]} {key[2]} for {key[1]}: {exc.__class__.__name__}: {exc}"
                raise ModelUnavailable(self._failed[key]) from exc
        return self._loaded[key]

    def _load_llama(self, model: str, lookup_tokens: int | None):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from draftwise.models import resolve

        resolved = resolve(model)
        if resolved.kind != "gguf":
            raise ValueError(f"llama.cpp loads .gguf models; {model!r} is a {resolved.kind}")
        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        return Llama(model_path=resolved.path, n_ctx=LLAMA_N_CTX, n_threads=self.threads, n_threads_batch=self.threads,
                     seed=self.seed, draft_model=draft, logits_all=llama_logits_all(lookup_tokens), verbose=False)


def llama_logits_all(lookup_tokens: int | None) -> bool:
    """Whether the pool opens llama-cpp-python's `Llama` with logits_all (method descriptions say so).

    With a draft, `Llama` keeps logits for every row anyway, but (0.3.36) sizes its score buffer
    by this argument, n_batch = 512 rows without it, so a lookup generation crashed with a numpy
    broadcast error once it ran past position 512.  Logit computation is unchanged (a draft
    already forces it on); only the buffer grows."""
    return bool(lookup_tokens)
