"""One executor per method: turns chat messages into token ids and runs one timed generation.

draftwise methods are opened through `draftwise.api.open_decoder` (the same path as the CLI,
backends from the run's shared pool), peers in
`peers.py`.  Every executor times its call the same way (perf_counter around the whole call,
prefill included, as Spec-Bench does) and records emit events from the generation's own
callback.  `run_batch` decodes a list of prompts with B requests in flight (`--concurrency`):
draftwise methods through `Engine` (`closed_loop.py`), transformers' `generate` on padded
waves (`peers.py`); a method that cannot batch raises `BatchRefused` (or the `InputError`
draftwise's batch engine refuses it with).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol, Sequence

from draftwise.api import Decoder, open_decoder
from draftwise.bench.cells import CellRun
from draftwise.bench.closed_loop import run_closed_loop
from draftwise.bench.methods import MethodSpec
from draftwise.bench.outputs import EmitClock, TurnOutput
from draftwise.bench.pool import ModelPool, ModelUnavailable
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.stats import PHASES


class Executor(Protocol):
    method: MethodSpec

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]: ...

    def run(self, prompt: Sequence[int], max_new_tokens: int | None = None) -> TurnOutput: ...

    def run_batch(self, prompts: Sequence[tuple[str, Sequence[int]]], batch: int,
                  max_new_tokens: int | None = None) -> CellRun:
        """Every (question_id, prompt ids) decoded with `batch` requests in flight."""

    def gate_profile(self) -> dict | None:
        """The verify-cost profile a cost gate decides by; None without a gate."""


class DraftwiseExecutor:
    def __init__(self, method: MethodSpec, opened: Decoder) -> None:
        self.method = method
        self.target = opened.target
        self._opened = opened
        self._decoders: dict[int, object] = {}

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        return self.target.chat_prompt(messages)

    def _decoder(self, max_new_tokens: int | None):
        limit = max_new_tokens or self._opened.spec.generation.max_new_tokens
        if limit not in self._decoders:  # warm-up asks for fewer tokens; build once per length
            self._decoders[limit] = self._opened.sized(limit).engine
        return self._decoders[limit]

    def gate_profile(self) -> dict | None:
        """The verify-cost profile the cost gate decides by (None without a gate or before any
        decoder exists): the gate's choices follow it, so a run records which one it used."""
        for decoder in self._decoders.values():
            gate = decoder.config.gate
            if gate is not None:
                return gate.profile.to_json()
        return None

    def run_batch(self, prompts: Sequence[tuple[str, Sequence[int]]], batch: int,
                  max_new_tokens: int | None = None) -> CellRun:
        """A fresh batch engine of `batch` slots (its own KV and rounds) per call; InputError when
        the method's drafter cannot share a batch."""
        generation = self._opened.spec.generation
        config = replace(generation, max_new_tokens=max_new_tokens or generation.max_new_tokens)
        return run_closed_loop(self._opened.batch(batch), prompts, batch, config)

    def run(self, prompt: Sequence[int], max_new_tokens: int | None = None) -> TurnOutput:
        decoder = self._decoder(max_new_tokens)
        clock = EmitClock()
        result = decoder.generate(list(prompt), on_tokens=lambda tokens: clock.emit(len(tokens)))
        wall = time.perf_counter() - clock.start
        records = result.records
        return TurnOutput(
            tokens=result.tokens,
            text=result.text,
            wall_time=wall,
            emit_offsets=tuple(clock.offsets),
            accept_lengths=tuple(r.emitted for r in records),
            rounds=tuple((r.nodes, r.proposal_depth, r.accepted, r.emitted, int(r.fallback), *_frontier(r))
                         for r in records),
            phase_seconds={p: sum(r.seconds.get(p, 0.0) for r in records) for p in PHASES},
            max_kv_bytes=max((r.kv_bytes for r in records), default=0),
            by_source={name: [int(v["rounds"]), int(v["rows"]), int(v["accepted"]), int(v["unasked"])]
                       for name, v in result.stats.by_source.items()},
        )


def _frontier(record) -> tuple[int, int]:
    """(candidates the frontier offered, slot of the one selected or -1); (0, -1) without any."""
    return record.slot_path[0] if record.slot_path else (0, -1)


def prepare(method: MethodSpec, pool: ModelPool, generation: GenerationConfig) -> Executor:
    """Load (or reuse) what `method` needs; raises ModelUnavailable or ImportError with the reason."""
    if method.kind == "dw":
        def load(model: str, backend: str, role: str):
            return pool.backend(model, backend, role=role, strict=method.decoder.strict_scope)

        opened = open_decoder(method.decoder, loader=load)  # its progress lines reach the run's log (bench.main)
        for choice in opened.choices:  # the answers record what was chosen: describe() reads the resolved spec
            pool.say(f"{method.name}: {choice.what} auto -> {choice.chosen}\n{choice.detail}")
        if opened.choices:
            method = replace(method, decoder=opened.spec, draft=opened.spec.draft if opened.spec.uses_draft_model else None)
        return DraftwiseExecutor(method, opened)
    if method.kind == "vllm":
        return _vllm_executor(method, pool, generation)
    from draftwise.bench.peers import HfExecutor, LlamaCppExecutor

    if method.backend == "transformers":
        target = pool.backend(method.target, "transformers")
        assistant = pool.backend(method.draft, "transformers", role="draft").model if method.kind == "hf-assisted" else None
        return HfExecutor(method, target, assistant, generation)
    llama = pool.llama(method.target, method.peer_lookup_tokens, draftwise_context=method.fed_like_draftwise)
    tokenizer = pool.backend(method.target, "llamacpp")  # same chat rendering and EOS set as draftwise's llama.cpp methods
    return LlamaCppExecutor(method, llama, tokenizer, generation)


def _vllm_executor(method: MethodSpec, pool: ModelPool, generation: GenerationConfig) -> Executor:
    """vLLM in its own environment (.venv-vllm): one kept-loaded engine per batch size, closed
    when the run ends; ModelUnavailable where that environment is absent."""
    from draftwise.bench.vllm_executor import VllmExecutor, VllmSessions
    from draftwise.vllm.checkpoint import vllm_checkpoint
    from draftwise.vllm.methods import parse_method as parse_vllm
    from draftwise.vllm.runner import SETUP_HINT, VllmEnvironment

    environment = VllmEnvironment()
    if not environment.python.is_file():
        raise ModelUnavailable(f"{method.name}: vLLM's environment is absent ({SETUP_HINT})")
    assert method.vllm is not None
    sessions = VllmSessions(str(vllm_checkpoint(method.target)), method.dtype, parse_vllm(method.vllm),
                            environment=environment)
    tokenizer = pool.backend(method.target, "transformers")  # the same chat rendering and EOS set
    return VllmExecutor(method, sessions.generate, tokenizer, generation.max_new_tokens, close=sessions.close)
