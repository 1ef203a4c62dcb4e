"""The serving benchmark's settings: typed, parsed once from the command line's strings, with
every default defined here (the CLI reads them from `ServeBenchSettings()`)."""

from __future__ import annotations

from typing import Any

import math
from dataclasses import asdict, dataclass

from draftwise.bench.serving.loadgen import CHAT, CLOSED, COMPLETIONS, OPEN, Load, Sampling
from draftwise.bench.serving.servers import BUILTIN, ServerSpec, parse_server
from draftwise.errors import InputError
from draftwise.models import DEFAULT_MODEL
from draftwise.workloads import parse_workloads

REFERENCE_SERVER = "draftwise-none"  # exactness is counted against this server's texts


@dataclass(frozen=True)
class ServeBenchSettings:
    servers: tuple[ServerSpec, ...] = tuple(BUILTIN.values())
    loads: tuple[Load, ...] = (Load(CLOSED, 1), Load(CLOSED, 4), Load(CLOSED, 8))
    workload: str = "humaneval:0-79"  # the development problems; the first `num_prompts` are asked
    num_prompts: int = 16
    max_tokens: int = 64
    temperature: float = 0.0  # greedy: texts are then compared with the reference server's
    seed: int = 0  # sampling seed of every request and the open loop's arrivals
    endpoint: str = COMPLETIONS  # the first turn as a raw prompt (vLLM's default), or CHAT messages
    repeats: int = 1
    target: str = DEFAULT_MODEL
    backend: str = "llamacpp"  # draftwise servers' backend: the same GGUF and kernels as llama_cpp.server
    threads: int | None = None  # CPU threads of every server; None: all cores
    request_timeout_s: float = 300.0
    startup_timeout_s: float = 600.0  # --proposer auto may measure profiles before it listens

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.max_tokens, self.temperature, self.seed)

    def as_json(self) -> dict[str, Any]:
        """What a resumed run must share with the results it continues (repeats may grow)."""
        data = asdict(self)
        data["servers"] = [asdict(s) for s in self.servers]
        data["loads"] = [asdict(load) for load in self.loads]
        return data


def parse_servers(names: str, definitions: list[str]) -> tuple[ServerSpec, ...]:
    """`names` (comma-separated) picks the servers, in order; each is built in or defined by one
    of `definitions` (NAME=KIND[:ARGS])."""
    defined = {spec.name: spec for spec in (parse_server(d) for d in definitions)}
    picked = [n.strip() for n in names.split(",") if n.strip()] or list(defined)
    if len(set(picked)) != len(picked):
        raise InputError(f"--servers names a server twice: {names!r}")
    return tuple(defined[n] if n in defined else parse_server(n) for n in picked)


def parse_loads(concurrency: str, rates: str) -> tuple[Load, ...]:
    """Closed-loop concurrencies ("1,4,8") and open-loop rates in req/s ("0.5,1,inf")."""
    loads = [Load(CLOSED, c) for c in _numbers(concurrency, "--concurrency", integer=True)]
    loads += [Load(OPEN, r) for r in _numbers(rates, "--rates", integer=False)]
    if not loads:
        raise InputError("no load: give --concurrency, --rates or both")
    return tuple(loads)


def _numbers(text: str, option: str, integer: bool) -> list[float]:
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(int(part)) if integer else float(part)
        except ValueError:
            raise InputError(f"{option}: {part!r} is not a {'whole ' if integer else ''}number") from None
        if not value > 0 or math.isnan(value) or (integer and math.isinf(value)):
            raise InputError(f"{option}: {part!r} must be positive")
        values.append(value)
    return values


def check(settings: ServeBenchSettings) -> ServeBenchSettings:
    """Refusals before any server starts."""
    if settings.endpoint not in (COMPLETIONS, CHAT):
        raise InputError(f"--endpoint must be {COMPLETIONS} or {CHAT}, got {settings.endpoint!r}")
    for name, value in (("--num-prompts", settings.num_prompts), ("--max-tokens", settings.max_tokens),
                        ("--repeats", settings.repeats), ("--threads", 1 if settings.threads is None else settings.threads)):
        if value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if settings.temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {settings.temperature}")
    if not settings.servers:
        raise InputError("no server to measure")
    return settings


def first_turns(workload: str, count: int) -> list[str]:
    """The first user turn of the workload's first `count` questions (the workload loaders of
    `draftwise bench`; a multi-turn question contributes its first turn only)."""
    questions = parse_workloads([workload]).questions
    if len(questions) < count:
        raise InputError(f"workload {workload!r} has {len(questions)} questions; --num-prompts asks for {count}")
    return [q.turns[0] for q in questions[:count]]
