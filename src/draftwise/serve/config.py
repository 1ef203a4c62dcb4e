"""The server's settings: one frozen config, checked once when the command line is read."""

from __future__ import annotations

from dataclasses import dataclass

from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError

# a request that names no max_tokens gets the engine's own default length
DEFAULT_MAX_TOKENS = GenerationConfig().max_new_tokens


@dataclass(frozen=True)
class ServeConfig:
    model: str  # the id clients name in `model` (and /v1/models lists)
    max_batch: int = 8  # requests decoded in one round (the engine's slots)
    max_queue: int = 32  # requests waiting for a slot; more are refused with 429
    request_timeout: float = 600.0  # seconds from arrival; then the request is cancelled (finish_reason "timeout")
    max_tokens_limit: int = 2048  # the largest max_tokens a request may ask for
    max_body_bytes: int = 1 << 20  # a larger body is refused with 413 before it is parsed
    max_stop_strings: int = 4  # OpenAI's own limit
    grace_seconds: float = 30.0  # after SIGTERM: how long in-flight requests may run before they are cancelled
    retry_after_seconds: int = 1  # the Retry-After of a 429

    def __post_init__(self) -> None:
        if not self.model:
            raise InputError("the served model needs a name (--model-name)")
        for name in ("max_batch", "max_tokens_limit", "max_body_bytes", "max_stop_strings", "retry_after_seconds"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise InputError(f"--max-queue must be >= 0, got {self.max_queue}")
        if not self.request_timeout > 0:
            raise InputError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if not self.grace_seconds >= 0:
            raise InputError(f"--grace-seconds must be >= 0, got {self.grace_seconds}")

    @property
    def capacity(self) -> int:
        """Requests admitted at once: decoding (max_batch) plus waiting (max_queue)."""
        return self.max_batch + self.max_queue

    @property
    def default_max_tokens(self) -> int:
        return min(DEFAULT_MAX_TOKENS, self.max_tokens_limit)
