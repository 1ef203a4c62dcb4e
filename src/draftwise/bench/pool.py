"""Models loaded once per benchmark run and shared by every method that names them.

Sharing is the point: the transformers peers call `generate` on the very model object that
draftwise's transformers methods verify with, so weights, dtype and threads are the same.
A load that fails is remembered with its reason, so every method needing it is skipped
with that reason instead of retrying.
"""

from __future__ import annotations

from typing import Any, Callable

from draftwise.backends.base import Backend, StrictScope
from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice
from draftwise.errors import ModelError
from draftwise.measure.load import load_backend

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

    def backend(self, model: str, kind: str, role: str = "target", strict: StrictScope | None = None) -> Backend:
        """A draftwise backend ('transformers' or 'llamacpp') for `model`.  Targets and drafts are
        separate objects even for the same model: a backend holds one KV cache, and a draft
        sharing its target's cache would overwrite the rows the target is verifying against.
        Each backend sizes its per-round resources itself when a decoder starts."""
        dtype = self.dtype if kind == "transformers" else DEFAULT_DTYPE  # llama.cpp runs the GGUF's own types
        strict = strict if role == "target" else None  # a draft's rows only choose candidates
        return self._get(("backend", model, kind, role) + ((f"strict {strict}",) if strict else ()),
                         lambda: load_backend(model, kind, self.threads, dtype=dtype, strict=strict))

    def llama(self, model: str, lookup_tokens: int | None, draftwise_context: bool = False) -> object:
        """llama-cpp-python's high-level `Llama`; with `lookup_tokens` it carries LlamaPromptLookupDecoding.
        Two objects, not one: a draft model makes `Llama` keep logits for every row (logits_all),
        which is fixed when the context is created.  `draftwise_context` opens a third, with the
        context settings of draftwise's llama.cpp backend (`draftwise_context_settings`), for the
        plain peer that is compared like for like with draftwise's plain decoding."""
        key = ("llama", model, lookup_tokens, "draftwise-context" if draftwise_context else None)
        return self._get(key, lambda: self._load_llama(model, lookup_tokens, draftwise_context))

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

    def _load_llama(self, model: str, lookup_tokens: int | None, draftwise_context: bool = False):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from draftwise.models import resolve

        resolved = resolve(model)
        if resolved.kind != "gguf":
            raise ValueError(f"llama.cpp loads .gguf models; {model!r} is a {resolved.kind}")
        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        settings: dict[str, Any] = draftwise_context_settings() if draftwise_context else {}
        return Llama(model_path=resolved.path, n_ctx=LLAMA_N_CTX, n_threads=self.threads, n_threads_batch=self.threads,
                     seed=self.seed, draft_model=draft, logits_all=llama_logits_all(lookup_tokens), verbose=False,
                     **settings)


def draftwise_context_settings() -> dict[str, Any]:
    """`Llama` arguments that make its context the one draftwise's llama.cpp backend creates.

    Both start from `llama_context_default_params()` and agree on n_batch = n_ubatch = 512,
    F16 K/V, flash attention off, n_seq_max 1, threads.  `Llama` overrides three YaRN values
    with numbers (attn_factor 1, beta_fast 32, beta_slow 1) where the defaults are -1 = "the
    model's own": the same numbers for a model without YaRN metadata (SmolLM2 and
    Qwen2.5-Coder give bit-identical logits either way), not for one that declares them.  It
    also turns perf counters on (no_perf False: timing only).  One difference stays: `Llama`
    sets kv_unified only for embedding models, draftwise always; with n_seq_max 1 llama.cpp
    keeps one KV stream either way."""
    import llama_cpp

    defaults = llama_cpp.llama_context_default_params()
    return {"yarn_attn_factor": defaults.yarn_attn_factor, "yarn_beta_fast": defaults.yarn_beta_fast,
            "yarn_beta_slow": defaults.yarn_beta_slow, "no_perf": defaults.no_perf}


def llama_logits_all(lookup_tokens: int | None) -> bool:
    """Whether the pool opens llama-cpp-python's `Llama` with logits_all (method descriptions say so).

    With a draft, `Llama` keeps logits for every row anyway, but (0.3.36) sizes its score buffer
    by this argument, n_batch = 512 rows without it, so a lookup generation crashed with a numpy
    broadcast error once it ran past position 512.  Logit computation is unchanged (a draft
    already forces it on); only the buffer grows."""
    return bool(lookup_tokens)
