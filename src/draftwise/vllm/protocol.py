"""What draftwise's side sends the vLLM worker and what it gets back: plain JSON-shaped frozen
dataclasses, stdlib only, because this module is imported on both sides of the subprocess
boundary (draftwise's .venv and .venv-vllm)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

SESSION_MARK = "@@draftwise "  # a session worker's replies on stdout start with it (vLLM logs to stdout too)


@dataclass(frozen=True)
class VllmMethod:
    """One vLLM configuration: `speculative_config` as vLLM's LLM(...) takes it (None: plain)."""

    name: str  # as the bench and reports show it, e.g. "vllm-ngram:k=4"
    speculative_config: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment (a custom proposer's config path)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "VllmMethod":
        return cls(name=str(body["name"]), speculative_config=body.get("speculative_config"),
                   env=dict(body.get("env") or {}))


@dataclass(frozen=True)
class WorkerRequest:
    model: str  # a vLLM-loadable directory (draftwise.vllm.checkpoint)
    dtype: str  # vLLM's dtype name: bfloat16, float32
    prompts: tuple[tuple[int, ...], ...]  # token ids, chat template already applied
    max_tokens: int
    batch_sizes: tuple[int, ...]  # the prompts run in groups of B, each group one concurrent batch
    methods: tuple[VllmMethod, ...]
    max_model_len: int = 2048
    ignore_eos: bool = False
    # vLLM compiles the model with torch.compile by default: slow per engine on a busy CPU
    # machine (cached once per shape set); eager skips it, which the study records per run
    enforce_eager: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "WorkerRequest":
        return cls(model=body["model"], dtype=body["dtype"],
                   prompts=tuple(tuple(int(t) for t in p) for p in body["prompts"]),
                   max_tokens=int(body["max_tokens"]), batch_sizes=tuple(int(b) for b in body["batch_sizes"]),
                   methods=tuple(VllmMethod.from_json(m) for m in body["methods"]),
                   max_model_len=int(body.get("max_model_len", 2048)), ignore_eos=bool(body.get("ignore_eos", False)),
                   enforce_eager=bool(body.get("enforce_eager", False)))


@dataclass(frozen=True)
class BatchResult:
    """One method at one batch size, over every prompt."""

    method: str
    batch: int
    tokens: tuple[tuple[int, ...], ...]  # new token ids per prompt, in prompt order
    wall_s: float  # generation time of every group, load and warm-up excluded
    new_tokens: int
    # vLLM's own speculation counters over this run (drafts, draft_tokens, accepted); empty for plain
    spec_counters: Mapping[str, float] = field(default_factory=dict)
    load_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "BatchResult":
        return cls(method=body["method"], batch=int(body["batch"]),
                   tokens=tuple(tuple(int(t) for t in p) for p in body["tokens"]), wall_s=float(body["wall_s"]),
                   new_tokens=int(body["new_tokens"]), spec_counters=dict(body.get("spec_counters") or {}),
                   load_s=float(body.get("load_s", 0.0)))


@dataclass(frozen=True)
class ProfileRequest:
    """t_B(n) measured in vLLM itself: for each n, an engine whose custom proposer drafts n - 1
    tokens every step (a fixed, never-accepted draft: every step verifies n rows a request and
    commits one token); per B, B requests of `prefix_len` distinct tokens decode `long` and
    `short` tokens, and (wall(long) - wall(short)) / (long - short) is one step, prefill excluded."""

    model: str
    dtype: str
    batch_sizes: tuple[int, ...]
    rows: tuple[int, ...]  # n: verified rows per request (1 = plain decoding)
    prefix_len: int = 256
    short: int = 8
    long: int = 32
    repeats: int = 3
    max_model_len: int = 2048
    enforce_eager: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"kind": "profile", **asdict(self)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ProfileRequest":
        fields = {k: v for k, v in body.items() if k != "kind"}
        return cls(**{**fields, "batch_sizes": tuple(fields["batch_sizes"]), "rows": tuple(fields["rows"])})


@dataclass(frozen=True)
class SessionRequest:
    """One engine kept loaded (`draftwise.vllm.session`): generations are asked for one at a time."""

    model: str
    dtype: str
    method: VllmMethod
    max_batch: int = 1
    max_model_len: int = 2048
    enforce_eager: bool = False

    @property
    def batch_sizes(self) -> tuple[int, ...]:  # what `worker.engine` sizes max_num_seqs by
        return (self.max_batch,)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "session", **asdict(self)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "SessionRequest":
        return cls(model=body["model"], dtype=body["dtype"], method=VllmMethod.from_json(body["method"]),
                   max_batch=int(body["max_batch"]), max_model_len=int(body["max_model_len"]),
                   enforce_eager=bool(body["enforce_eager"]))
