"""The load generator: streamed requests timed chunk by chunk, in a closed or an open loop.

Every time is `time.perf_counter()` seconds from the cell's start (t0), on the client: what a
user of the server sees, queueing and HTTP included.  A request records when it was sent,
when each chunk that carried text arrived, the text, and the completion tokens the server
reported in its usage chunk (`stream_options.include_usage`); a server that reports none is
counted one token per text chunk (`tokens_counted`), which is exact only where each chunk holds
one token.

- closed loop, concurrency C: C workers, each sending the next prompt as soon as its last
  request finished (vLLM's `--max-concurrency C` with every request ready at once);
- open loop, rate R: request i is sent at t0 + a_i, a_0 = 0 and the gaps exponential with mean
  1/R (Poisson arrivals, vLLM's `--request-rate R` with burstiness 1), drawn from a seeded
  generator, whether or not earlier requests have finished; R = inf sends all at once."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable, Sequence

import httpx
import numpy as np

from draftwise.bench.serving.sse import SSEDecoder, StreamError, read_chunk

CLOSED, OPEN = "closed", "open"
COMPLETIONS, CHAT = "completions", "chat"
ENDPOINTS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}


@dataclass(frozen=True)
class Load:
    """One load level: closed loop at `value` concurrent requests, or open loop at `value` req/s."""

    mode: str  # CLOSED or OPEN
    value: float

    @property
    def label(self) -> str:
        return f"c={int(self.value)}" if self.mode == CLOSED else f"rate={self.value:g}"


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float
    seed: int


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://127.0.0.1:PORT
    model: str  # the id the server lists under /v1/models
    kind: str  # COMPLETIONS or CHAT
    fields: tuple[tuple[str, Any], ...] = ()  # request fields this server needs besides the OpenAI ones

    def payload(self, prompt: str, sampling: Sampling) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                                "seed": sampling.seed, "stream": True, "stream_options": {"include_usage": True},
                                **dict(self.fields)}
        if self.kind == CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body


@dataclass(frozen=True)
class RequestRecord:
    index: int  # the prompt's position in the run's prompt list
    sent: float
    chunk_times: tuple[float, ...]  # arrival of each chunk with text, ascending
    text: str
    completion_tokens: int | None  # from the usage chunk; None when the server sent none
    finish_reason: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Complete: no error, some text, and a finish reason (a stream without one was cut short)."""
        return self.error is None and bool(self.chunk_times) and self.finish_reason is not None

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)

    @property
    def tokens_counted(self) -> bool:
        return self.completion_tokens is None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "chunk_times": list(self.chunk_times)}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RequestRecord:
        return cls(**{**row, "chunk_times": tuple(row["chunk_times"])})


@dataclass(frozen=True)
class CellRun:
    duration_s: float  # t0 to the last request's end (vLLM's benchmark duration)
    records: tuple[RequestRecord, ...]  # in prompt order


SendOne = Callable[[int, str], Awaitable[RequestRecord]]


async def stream_request(client: httpx.AsyncClient, endpoint: Endpoint, sampling: Sampling, t0: float,
                         index: int, prompt: str) -> RequestRecord:
    """One streamed request; every failure (HTTP status, transport, a malformed stream) is
    kept in the record, so one bad request never stops a cell."""
    sent = time.perf_counter() - t0
    times: list[float] = []
    parts: list[str] = []
    usage: int | None = None
    finish: str | None = None
    try:
        async with client.stream("POST", endpoint.base_url + ENDPOINTS[endpoint.kind],
                                 json=endpoint.payload(prompt, sampling)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                raise StreamError(f"HTTP {response.status_code}: {body[:300]}")
            decoder = SSEDecoder()
            done = False
            async for piece in response.aiter_text():
                now = time.perf_counter() - t0
                for data in decoder.feed(piece):
                    chunk = read_chunk(data)
                    if chunk is None:
                        done = True
                        break  # [DONE]: nothing after it counts, and the server may be slow to close
                    if chunk.text:
                        times.append(now)
                        parts.append(chunk.text)
                    finish = chunk.finish_reason or finish
                    usage = chunk.completion_tokens if chunk.completion_tokens is not None else usage
                if done:
                    break
            if not done:
                raise StreamError("the stream ended without data: [DONE]")
            if finish is None:
                raise StreamError("the stream ended without a finish_reason (cut short)")
    except (httpx.HTTPError, StreamError, json.JSONDecodeError) as exc:
        return RequestRecord(index, sent, tuple(times), "".join(parts), usage, finish, f"{type(exc).__name__}: {exc}")
    return RequestRecord(index, sent, tuple(times), "".join(parts), usage, finish)


async def closed_loop(send: SendOne, prompts: Sequence[str], concurrency: int) -> list[RequestRecord]:
    pending = iter(enumerate(prompts))  # shared: each worker takes the next prompt
    records: list[RequestRecord] = []

    async def worker() -> None:
        for index, prompt in pending:
            records.append(await send(index, prompt))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


def arrival_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Send times (s from t0) of `count` Poisson arrivals at `rate` req/s; the first at 0."""
    if math.isinf(rate):
        return [0.0] * count
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(count - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:count]


async def open_loop(send: SendOne, prompts: Sequence[str], offsets: Sequence[float], t0: float) -> list[RequestRecord]:
    async def at(offset: float, index: int, prompt: str) -> RequestRecord:
        await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
        return await send(index, prompt)

    return list(await asyncio.gather(*(at(o, i, p) for i, (o, p) in enumerate(zip(offsets, prompts)))))


async def run_cell(endpoint: Endpoint, prompts: Sequence[str], load: Load, sampling: Sampling,
                   timeout_s: float) -> CellRun:
    """Every prompt once under `load`; the arrivals' seed is the sampling seed."""
    in_flight = len(prompts) if load.mode == OPEN else int(load.value)
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = time.perf_counter()

        async def send(index: int, prompt: str) -> RequestRecord:
            return await stream_request(client, endpoint, sampling, t0, index, prompt)

        if load.mode == CLOSED:
            records = await closed_loop(send, prompts, int(load.value))
        else:
            records = await open_loop(send, prompts, arrival_offsets(len(prompts), load.value, sampling.seed), t0)
        duration = time.perf_counter() - t0
    return CellRun(duration, tuple(sorted(records, key=lambda r: r.index)))
