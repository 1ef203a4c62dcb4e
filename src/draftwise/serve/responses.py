"""OpenAI's response shapes: a whole completion, and the chunks of a streamed one."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from draftwise.serve.engine_worker import Done


@dataclass(frozen=True)
class Shape:
    """What every object of one response repeats: its id, creation time, model, and kind."""

    model: str
    chat: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}")

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, done: Done) -> dict[str, Any]:
        """The non-streamed response."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": done.answer}, "logprobs": None,
                      "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": done.answer, "logprobs": None, "finish_reason": done.finish_reason}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(done), "draftwise": dict(done.draftwise)}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False,
              done: Done | None = None) -> dict[str, Any]:
        """One streamed chunk: a piece of text (the chat's first names the role), or the last one
        with the finish reason and the `draftwise` statistics."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        out = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if done is not None:
            out["draftwise"] = dict(done.draftwise)
        return out

    def usage_chunk(self, done: Done) -> dict[str, Any]:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage(done)}


def usage(done: Done) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()
