"""A `draftwise bench` executor for a vLLM method (not yet listed by the bench's method parser:
see docs/vllm.md).  One engine per batch size, kept loaded (`VllmSession`), because an engine
takes a minute or more to load and the bench asks for one turn at a time.

vLLM is run offline, not streamed: a turn's tokens arrive as one chunk when its generate call
returns, so latency figures (TTFT, ITL) are not comparable with streamed methods; throughput
and tokens are.  `run_batch(prompts, B)` hands every prompt to an engine of B sequences at
once: vLLM's scheduler runs B and admits the next as one finishes (closed loop, as the bench's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from draftwise.backends.base import Backend
from draftwise.bench.cells import CellRun, RequestTrace
from draftwise.bench.outputs import TurnOutput
from draftwise.vllm.protocol import SessionRequest, VllmMethod
from draftwise.vllm.runner import VllmEnvironment
from draftwise.vllm.session import SessionReply, VllmSession

Generate = Callable[[int, Sequence[Sequence[int]], int], SessionReply]  # (batch, prompts, max_tokens) -> reply


@dataclass
class VllmSessions:
    """One open session per batch size, opened on first use; `close` ends them all."""

    model: str
    dtype: str
    method: VllmMethod
    enforce_eager: bool = False
    environment: VllmEnvironment = field(default_factory=VllmEnvironment)
    _open: dict[int, VllmSession] = field(default_factory=dict)

    def generate(self, batch: int, prompts: Sequence[Sequence[int]], max_tokens: int) -> SessionReply:
        if batch not in self._open:
            session = VllmSession(SessionRequest(self.model, self.dtype, self.method, max_batch=batch,
                                                 enforce_eager=self.enforce_eager), self.environment)
            self._open[batch] = session.__enter__()
        return self._open[batch].generate(prompts, max_tokens)

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].__exit__(None, None, None)


class VllmExecutor:
    def __init__(self, method: object, generate: Generate, tokenizer: Backend, max_new_tokens: int,
                 close: Callable[[], None] | None = None) -> None:
        self.method = method  # the bench's MethodSpec
        self._generate = generate
        self._close = close  # ends the engines' processes (the bench calls it when the run ends)
        self.tokenizer = tokenizer  # draftwise's backend of the same model: chat template and EOS set
        self.max_new_tokens = max_new_tokens

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.tokenizer.chat_prompt(messages)

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def gate_profile(self) -> None:  # vLLM has no cost gate
        return None

    def run(self, prompt: Sequence[int], max_new_tokens: int | None = None) -> TurnOutput:
        start = time.perf_counter()
        reply = self._generate(1, [prompt], max_new_tokens or self.max_new_tokens)
        wall = time.perf_counter() - start
        tokens = reply.tokens[0]
        eos = self.tokenizer.info.eos_token_ids
        return TurnOutput(tokens=tokens, text=self.tokenizer.detokenize([t for t in tokens if t not in eos]),
                          wall_time=wall, emit_offsets=(wall,), accept_lengths=None)

    def run_batch(self, prompts: Sequence[tuple[str, Sequence[int]]], batch: int,
                  max_new_tokens: int | None = None) -> CellRun:
        start = time.perf_counter()
        reply = self._generate(batch, [p for _, p in prompts], max_new_tokens or self.max_new_tokens)
        wall = time.perf_counter() - start
        # every prompt is handed to vLLM at once (sent 0); vLLM queues those beyond B
        requests = tuple(RequestTrace(question_id=qid, sent=0.0, chunk_offsets=(wall,), chunk_tokens=(len(tokens),),
                                      tokens=tokens) for (qid, _), tokens in zip(prompts, reply.tokens))
        return CellRun(wall_time=wall, requests=requests, kv_peak_bytes=None, kv_rows_peak_bytes=None, rss_peak_bytes=0)
