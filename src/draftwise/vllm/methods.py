"""vLLM method strings, parsed once into `VllmMethod`s (vLLM's speculative_config):

    vllm-plain                          no speculation
    vllm-ngram[:k=5,ngram=4,min=4]      vLLM's own n-gram drafter (prompt_lookup_max / _min)
    vllm-draft:draft=DIR[,k=4]          a draft model (a vLLM-loadable directory)
    vllm-medusa:heads=DIR[,k=...]       Medusa heads in vLLM's layout
    vllm-custom=prompt-lookup[:k=4,ngram=2]   a draftwise drafter inside vLLM (custom_class)
    vllm-export=DIR                     the speculative_config `draftwise export vllm` wrote
    vllm-export-custom=DIR              the same choice as draftwise's prompt lookup inside vLLM

Defaults are vLLM's documented n-gram example, defined here once: num_speculative_tokens 5,
prompt_lookup_max 4 (prompt_lookup_min then defaults to the same 4): "vLLM's default" in reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import InputError
from draftwise.vllm.exported import load_exported_method
from draftwise.vllm.protocol import VllmMethod

DEFAULT_K = 5
DEFAULT_NGRAM_MAX = 4
CUSTOM_CLASS = "draftwise.vllm.proposer.DraftwiseProposer"
PROPOSER_ENV = "DRAFTWISE_VLLM_PROPOSER"  # the custom proposer's config (JSON), set in the worker's environment
_KEYS = {"vllm-plain": set(), "vllm-ngram": {"k", "ngram", "min"}, "vllm-draft": {"draft", "k"},
         "vllm-medusa": {"heads", "k"}, "vllm-custom": {"k", "ngram", "schedule"}}


@dataclass(frozen=True)
class CustomDrafterConfig:
    """What the custom proposer inside vLLM runs: draftwise's prompt lookup (chain), and K per
    batch size (`schedule`: (first B, last B, K) ranges, as vLLM's own schedule; K 0 = no draft;
    batch sizes before every range take `k`)."""

    drafter: str = "prompt-lookup"  # or "fixed": K copies of token 0 every step (profiling: every row verified, none accepted)
    k: int = DEFAULT_K
    max_ngram: int = 2  # draftwise's prompt-lookup default (PromptLookupConfig.max_ngram)
    schedule: tuple[tuple[int, int, int], ...] = ()

    def k_for(self, batch: int) -> int:
        """vLLM's own reading of the schedule: a batch size past a range (in a gap, or past the
        last one) keeps that range's K; one before every range takes `k`."""
        chosen = self.k
        for first, _, k in sorted(self.schedule):
            if batch >= first:
                chosen = k
        return chosen

    def to_json(self) -> str:
        return json.dumps({"drafter": self.drafter, "k": self.k, "max_ngram": self.max_ngram,
                           "schedule": [list(s) for s in self.schedule]})

    @classmethod
    def from_json(cls, text: str) -> "CustomDrafterConfig":
        body = json.loads(text)
        return cls(drafter=body["drafter"], k=int(body["k"]), max_ngram=int(body["max_ngram"]),
                   schedule=tuple((int(a), int(b), int(k)) for a, b, k in body.get("schedule", ())))


def _keys(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"{item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _int(keys: dict[str, str], key: str, default: int) -> int:
    try:
        value = int(keys.get(key, default))
    except ValueError:
        raise InputError(f"{key} must be an integer, got {keys[key]!r}") from None
    if value < 1:
        raise InputError(f"{key} must be >= 1, got {value}")
    return value


def parse_schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """'1-1:4/2-8:0' -> ((1, 1, 4), (2, 8, 0))."""
    out = []
    for item in filter(None, text.split("/")):
        span, _, k = item.partition(":")
        first, _, last = span.partition("-")
        out.append((int(first), int(last or first), int(k)))
    return tuple(out)


def parse_method(text: str) -> VllmMethod:
    """A method string -> its VllmMethod (vLLM speculative_config, environment)."""
    for prefix, custom in (("vllm-export=", False), ("vllm-export-custom=", True)):
        if text.startswith(prefix):
            return load_exported_method(Path(text.removeprefix(prefix)), custom=custom)
    kind, _, rest = text.partition(":")
    drafter = None
    if kind.startswith("vllm-custom="):
        kind, drafter = "vllm-custom", kind.removeprefix("vllm-custom=")
    if kind not in _KEYS:
        raise InputError(f"unknown vLLM method {kind!r}; known: {', '.join(sorted(_KEYS))}, vllm-export=DIR")
    keys = _keys(rest)
    unknown = set(keys) - _KEYS[kind]
    if unknown:
        raise InputError(f"{kind} takes {sorted(_KEYS[kind]) or 'no keys'}, not {sorted(unknown)}")
    k = _int(keys, "k", DEFAULT_K)
    if kind == "vllm-plain":
        return VllmMethod(text, None)
    if kind == "vllm-ngram":
        return VllmMethod(text, {"method": "ngram", "num_speculative_tokens": k,
                                 "prompt_lookup_max": _int(keys, "ngram", DEFAULT_NGRAM_MAX),
                                 "prompt_lookup_min": _int(keys, "min", _int(keys, "ngram", DEFAULT_NGRAM_MAX))})
    if kind == "vllm-draft":
        if "draft" not in keys:
            raise InputError("vllm-draft needs draft=DIR (a vLLM-loadable model directory)")
        return VllmMethod(text, {"method": "draft_model", "model": keys["draft"], "num_speculative_tokens": k})
    if kind == "vllm-medusa":
        if "heads" not in keys:
            raise InputError("vllm-medusa needs heads=DIR (Medusa heads in vLLM's layout)")
        return VllmMethod(text, {"method": "medusa", "model": keys["heads"], "num_speculative_tokens": k})
    if drafter != "prompt-lookup":
        raise InputError(f"vllm-custom runs draftwise's prompt-lookup inside vLLM; {drafter!r} is not supported yet")
    config = CustomDrafterConfig(drafter=drafter, k=k, max_ngram=_int(keys, "ngram", 2),
                                 schedule=parse_schedule(keys.get("schedule", "")))
    max_k = max([k, *(s[2] for s in config.schedule)])
    return VllmMethod(text, {"method": "custom_class", "model": CUSTOM_CLASS, "num_speculative_tokens": max_k},
                      env={PROPOSER_ENV: config.to_json()})


def profiling_method(rows: int) -> VllmMethod:
    """The engine that verifies `rows` rows a request every step (1: plain decoding)."""
    if rows == 1:
        return VllmMethod("vllm-profile:n=1", None)
    config = CustomDrafterConfig(drafter="fixed", k=rows - 1)
    return VllmMethod(f"vllm-profile:n={rows}", {"method": "custom_class", "model": CUSTOM_CLASS,
                                                 "num_speculative_tokens": rows - 1}, env={PROPOSER_ENV: config.to_json()})
