"""Peer implementations run in the same process, on the same weights, with the same stop rules.

transformers peers: `model.generate` on the draftwise TransformersBackend's own model object
(hf-assisted gets the draft backend's model as `assistant_model`; hf-prompt-lookup passes
`prompt_lookup_num_tokens`).  Greedy means do_sample=False; the EOS set is the backend's.
A streamer records emit events: transformers calls it once per verification step with every
token that step accepted, so accept lengths come out too.

Note: with the default "heuristic" schedule, transformers carries hf-assisted's draft length
over from one `generate` call to the next (it writes it back into the assistant's
generation_config); the peer is benchmarked as users get it.

With B requests in flight (`--concurrency`), `hf-plain` runs `generate` on padded batches of B
prompts: left padding, the attention mask marking it, greedy, the same `max_new_tokens` and EOS
set.  That is static batching: a wave ends when its longest request does, and only then does
the next wave start, so the closed loop runs in waves of B (a request is counted as sent when
its lane's previous request finished: its wait for the wave is part of its time to first token).
A sequence that ends early is filled with the pad token (EOS) until the wave ends; its tokens
stop at its first EOS.  transformers' assisted generation (`assistant_model`,
`prompt_lookup_num_tokens`) takes one sequence at a time, so those peers run at B = 1 only, and
llama-cpp-python has no multi-sequence generate: they are reported as refused at other B.

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
(the top two logits nearly equal) the argmax flips and the texts part.  The feed
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
from draftwise.bench.cells import BatchRefused, CellRun, RequestTrace
from draftwise.bench.env import current_rss_bytes
from draftwise.bench.methods import MethodSpec
from draftwise.bench.outputs import EmitClock, TurnOutput
from draftwise.runtime.round import GenerationConfig


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

    def run_batch(self, prompts: Sequence[tuple[str, Sequence[int]]], batch: int,
                  max_new_tokens: int | None = None) -> CellRun:
        """The prompts in waves of `batch`, each one padded `generate` call (static batching)."""
        if batch > 1 and self.method.kind != "hf-plain":
            raise BatchRefused(f"{self.method.kind}: transformers' assisted generation decodes one sequence at a time "
                               "(batch size 1)")
        kwargs = self._kwargs(max_new_tokens or self.generation.max_new_tokens)
        lanes = [0.0] * batch  # when each lane's previous request ended: its next one is sent then
        traces: list[RequestTrace] = []
        kv_peak, rss_peak, steps = 0, current_rss_bytes(), 0
        clock = EmitClock()
        for first in range(0, len(prompts), batch):
            wave = prompts[first:first + batch]
            out, prompt_len, offsets, counts = self._wave([list(p) for _, p in wave], kwargs, clock)
            steps += len(offsets)
            kv_peak = max(kv_peak, len(wave) * (prompt_len + len(offsets)) * (self.target.info.kv_row_bytes or 0))
            rss_peak = max(rss_peak, current_rss_bytes())
            for lane, (question_id, _) in enumerate(wave):
                tokens = self._until_eos(out[lane, prompt_len:].tolist())
                chunks = _per_request_chunks(offsets, [c // len(wave) for c in counts], len(tokens))
                traces.append(RequestTrace(question_id, lanes[lane], tuple(t for t, _ in chunks),
                                           tuple(n for _, n in chunks), tokens))
                lanes[lane] = chunks[-1][0] if chunks else lanes[lane]
        wall = time.perf_counter() - clock.start
        return CellRun(wall_time=wall, requests=tuple(traces), kv_peak_bytes=kv_peak or None,
                       kv_rows_peak_bytes=None, rss_peak_bytes=rss_peak, forwards=steps)

    def _wave(self, prompts: list[list[int]], kwargs: dict, clock: EmitClock) -> tuple[torch.Tensor, int, list, list]:
        """One left-padded `generate`: (its output ids [B, P + steps], P, step offsets, step token counts)."""
        model = self.target.model
        width = max(len(p) for p in prompts)
        pad = kwargs["pad_token_id"]
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long,
                            device=model.device)
        torch.manual_seed(self.generation.seed)
        before = len(clock.offsets)
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, streamer=_StepStreamer(clock), **kwargs)
        return out, width, clock.offsets[before:], clock.counts[before:]

    def _until_eos(self, ids: list[int]) -> tuple[int, ...]:
        """A padded row's own tokens: up to its first EOS, which is kept (the pad after it is the wave's)."""
        eos = self.target.info.eos_token_ids
        end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
        return tuple(int(t) for t in ids[:end])

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

    def run_batch(self, prompts: Sequence[tuple[str, Sequence[int]]], batch: int,
                  max_new_tokens: int | None = None) -> CellRun:
        raise BatchRefused(f"{self.method.kind}: llama-cpp-python has no multi-sequence generate (draftwise's plain "
                           "batched decoding on llama.cpp is the baseline there)")

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


def _per_request_chunks(offsets: Sequence[float], counts: Sequence[int], tokens: int) -> list[tuple[float, int]]:
    """(offset, tokens) of each step that brought this request a token of its own, up to `tokens`
    (a wave's later steps only pad a request that has ended)."""
    chunks: list[tuple[float, int]] = []
    left = tokens
    for offset, count in zip(offsets, counts):
        if left <= 0:
            break
        chunks.append((offset, min(count, left)))
        left -= chunks[-1][1]
    return chunks
