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

How `llamacpp-plain` is run, and why it parts from draftwise's plain decoding.  As users run
it (feed=generate, the default), `generate(prompt)` decodes the WHOLE prompt in one batch
(512-row chunks) and samples from its last row.  draftwise's engine decodes the prompt but its
last token (512-row chunks, last row's logits only), then that last token ALONE as the pending
row of its first step.  llama.cpp's CPU kernels are not batch-invariant: a row decoded alone
can differ from the same row inside a batch of >= 2 rows (flash attention off), so the last
prompt token's KV cell and the first logits differ between the two, and at a later near-tie
(top two a few hundredths of a logit apart) the argmax flips and the texts part.  The feed
alone decides it, not the sampler (both take the first argmax), the BOS (both get the same
ids) or the context settings (same threads and batch sizes; identical logits when fed alike):
see `benchmarks/llamacpp_plain_agreement/` for the counts.
`feed=draftwise` is the like-for-like run: `eval(prompt[:-1])` (the same 512-row chunks, last
row output only), then `generate([prompt[-1]], reset=False)`, which decodes just that token
after the cached ones and then one row per step, on a `Llama` opened with draftwise's context
settings (`pool.draftwise_context_settings`).  Its tokens are draftwise's plain decoding's, so
the bench's mismatch check tells a draftwise bug from llama.cpp's batch shapes; its speed is
llama-cpp-python's plus one one-row decode per prompt.
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
        feed, reset = list(prompt), True
        if self.method.fed_like_draftwise:  # the prompt but its last token first; that token alone in step 1
            self.llama.eval(feed[:-1])
            feed, reset = feed[-1:], False  # reset=False: decode just this token after the cached ones
        iterator = self.llama.generate(feed, reset=reset, temp=policy.temperature, top_k=policy.top_k,
                                       top_p=policy.top_p, min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
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
