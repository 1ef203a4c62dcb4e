"""Peer implementations run in the same process, on the same weights, with the same stop rules.

transformers peers: `model.generate` on the draftwise TransformersBackend's own model object
(hf-assisted gets the draft backend's model as `assistant_model`; hf-prompt-lookup passes
`prompt_lookup_num_tokens`).  Greedy means do_sample=False; the EOS set is the backend's.
A streamer records emit events: transformers calls it once per verification step with every
token that step accepted, so accept lengths come out too.

Note: with the default "heuristic" schedule, transformers carries hf-assisted's draft length
over from one `generate` call to the next (it writes it back into the assistant's
generation_config); the peer is benchmarked as users get it.

llama.cpp peers: llama-cpp-python's high-level `Llama.generate` token iterator, greedy
(temp=0 uses llama.cpp's greedy sampler), min_p/top_k/top_p/repeat penalties off.  `reset()`
before each call: otherwise `Llama` reuses the KV of a matching earlier prompt and skips the
prefill the other methods pay.  The prompt ids come from draftwise's llama.cpp backend, so
both llama.cpp families tokenize the chat identically.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from draftwise.backends.base import Backend
from draftwise.bench.methods import MethodSpec
from draftwise.bench.outputs import EmitClock, TurnOutput
from draftwise.engine import GenerationConfig


class _StepStreamer:
    """transformers streamer protocol (put/end); the first put is the prompt."""

    def __init__(self, clock: EmitClock) -> None:
        self.clock = clock
        self._seen_prompt = False

    def put(self, value) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.clock.emit(int(value.numel()))

    def end(self) -> None:
        pass


class HfExecutor:
    def __init__(self, method: MethodSpec, target: Backend, assistant, generation: GenerationConfig) -> None:
        self.method = method
        self.target = target
        self.assistant = assistant
        self.generation = generation

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        return self.target.chat_prompt(messages)

    def _kwargs(self, max_new_tokens: int) -> dict:
        eos = sorted(self.target.info.eos_token_ids)
        policy = self.generation.policy
        # neutral penalties stated outright: a checkpoint's own generation_config may ship others
        # (Qwen2.5 instruct releases carry repetition_penalty 1.05-1.1), and plain greedy has none
        kwargs = {"max_new_tokens": max_new_tokens, "min_new_tokens": 0, "num_beams": 1, "eos_token_id": eos,
                  "pad_token_id": eos[0], "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
        if policy.greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            kwargs.update(do_sample=True, temperature=policy.temperature, top_k=policy.top_k, top_p=policy.top_p)
        if self.method.kind == "hf-assisted":
            kwargs["assistant_model"] = self.assistant
        if self.method.kind == "hf-prompt-lookup":
            kwargs["prompt_lookup_num_tokens"] = self.method.lookup_tokens
        return kwargs

    def gate_profile(self) -> None:  # peers have no cost gate
        return None

    def run(self, prompt: Sequence[int], max_new_tokens: int | None = None) -> TurnOutput:
        kwargs = self._kwargs(max_new_tokens or self.generation.max_new_tokens)
        model = self.target.model
        input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)  # [1, P]
        torch.manual_seed(self.generation.seed)
        clock = EmitClock()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                 streamer=_StepStreamer(clock), **kwargs)
        wall = time.perf_counter() - clock.start
        tokens = tuple(int(t) for t in out[0, input_ids.shape[1]:].tolist())
        eos = self.target.info.eos_token_ids
        return TurnOutput(
            tokens=tokens,
            text=self.target.detokenize([t for t in tokens if t not in eos]),
            wall_time=wall,
            emit_offsets=tuple(clock.offsets),
            accept_lengths=tuple(clock.counts),
        )


class LlamaCppExecutor:
    def __init__(self, method: MethodSpec, llama, tokenizer: Backend, generation: GenerationConfig) -> None:
        self.method = method
        self.llama = llama
        self.tokenizer = tokenizer
        self.generation = generation

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        return self.tokenizer.chat_prompt(messages)

    def gate_profile(self) -> None:  # peers have no cost gate
        return None

    def run(self, prompt: Sequence[int], max_new_tokens: int | None = None) -> TurnOutput:
        limit = max_new_tokens or self.generation.max_new_tokens
        policy = self.generation.policy
        eos = self.tokenizer.info.eos_token_ids
        tokens: list[int] = []
        self.llama.reset()
        self.llama.set_seed(self.generation.seed)  # every call starts from the seed, as draftwise's and transformers' do
        clock = EmitClock()
        iterator = self.llama.generate(list(prompt), temp=policy.temperature, top_k=policy.top_k, top_p=policy.top_p,
                                       min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
        for token in iterator:
            clock.emit(1)
            tokens.append(int(token))
            if token in eos or len(tokens) >= limit:
                break
        iterator.close()
        wall = time.perf_counter() - clock.start
        return TurnOutput(
            tokens=tuple(tokens),
            text=self.tokenizer.detokenize([t for t in tokens if t not in eos]),
            wall_time=wall,
            emit_offsets=tuple(clock.offsets),
            accept_lengths=None,  # the iterator yields one token at a time, drafted or not
        )
