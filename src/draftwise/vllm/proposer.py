"""A draftwise drafter inside vLLM, through vLLM's `custom_class` proposer plug-in.

vLLM imports `DraftwiseProposer` by its path (speculative_config
`{"method": "custom_class", "model": "draftwise.vllm.proposer.DraftwiseProposer", ...}`),
constructs it with its VllmConfig, calls `load_model(model)` once (its CPU runner does so
unconditionally) and, every step, `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings)`: one token list per request (empty: no draft).  It gets no
hidden states and no probabilities, so only token-only drafters fit; vLLM verifies the drafts,
so greedy output stays vLLM's own plain output.

This module imports nothing of vLLM (the config is read by attribute), so its logic is tested
in draftwise's own environment.  Configuration comes from the environment variable
`DRAFTWISE_VLLM_PROPOSER` (JSON of `CustomDrafterConfig`), read once in the constructor:
the plug-in interface has no other channel.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from draftwise.proposers.prompt_lookup import PromptLookupConfig, find_continuations
from draftwise.vllm.methods import PROPOSER_ENV, CustomDrafterConfig

FIXED_TOKEN = 0  # the profiling drafter's token: a special token greedy text decoding does not emit


def propose_batch(config: CustomDrafterConfig, sampled_token_ids: Sequence[Sequence[int]],
                  num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray, max_k: int,
                  max_model_len: int) -> list[list[int]]:
    """One draft per request slot.  A slot with no sampled token this step (a request still in
    prefill, or not scheduled) gets none, as vLLM's own n-gram drafter does; K comes from the
    schedule for the number of requests that decode this step (the batch the verify pays for),
    capped by vLLM's num_speculative_tokens and by the room left in the context."""
    drafts: list[list[int]] = [[] for _ in sampled_token_ids]
    active = [i for i, sampled in enumerate(sampled_token_ids) if len(sampled)]
    k = min(config.k_for(len(active)), max_k)
    if k <= 0:
        return drafts
    for i in active:
        length = int(num_tokens_no_spec[i])  # [context tokens of request i, sampled ones included]
        room = min(k, max_model_len - length - 1)
        if room <= 0:
            continue
        if config.drafter == "fixed":  # profiling: `room` rows verified, (almost) never accepted
            drafts[i] = [FIXED_TOKEN] * room
            continue
        lookup = PromptLookupConfig(num_tokens=room, max_ngram=config.max_ngram)
        found = find_continuations(np.asarray(token_ids_cpu[i, :length], dtype=np.int64), lookup)
        drafts[i] = [int(t) for t in found[0]] if found else []
    return drafts


class DraftwiseProposer:
    """vLLM's custom_class proposer running draftwise's prompt lookup, K per batch size."""

    def __init__(self, vllm_config: Any) -> None:
        text = os.environ.get(PROPOSER_ENV)
        self.config = CustomDrafterConfig.from_json(text) if text else CustomDrafterConfig()
        self.max_k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass  # a token-only drafter has no model; vLLM's CPU runner calls this regardless

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        return propose_batch(self.config, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                             self.max_k, self.max_model_len)
