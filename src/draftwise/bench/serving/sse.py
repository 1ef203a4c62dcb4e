"""Server-Sent Events as the OpenAI streaming endpoints send them, and their chunks read.

The wire format (WHATWG HTML, "Server-sent events"): lines end in LF, CR LF or CR; a line
`data: X` adds X to the event's data (several data lines are joined with LF); a line starting
with ':' is a comment (keep-alives); a blank line ends the event.  A network read may stop
anywhere, mid-line or between CR and LF, so the decoder keeps what it has not finished."""

from __future__ import annotations

import json
from dataclasses import dataclass

DONE = "[DONE]"  # the OpenAI stream's last event


class StreamError(ValueError):
    """A stream event that is not an OpenAI chunk (or an error the server sent in the stream)."""


class SSEDecoder:
    """Feed text as it arrives; get back the data of every event it completed."""

    def __init__(self) -> None:
        self._buffer = ""
        self._data: list[str] = []

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        events: list[str] = []
        while True:
            line, ended = self._next_line()
            if not ended:
                return events
            if line == "":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                if field == "data":
                    self._data.append(value[1:] if value.startswith(" ") else value)

    def _next_line(self) -> tuple[str, bool]:
        """The next complete line (without its ending) and True, or ("", False) to wait for more.
        A CR at the very end may be the first half of CR LF: it waits for the next byte."""
        for i, char in enumerate(self._buffer):
            if char == "\n" or (char == "\r" and i + 1 < len(self._buffer)):
                skip = 2 if self._buffer[i : i + 2] == "\r\n" else 1
                line, self._buffer = self._buffer[:i], self._buffer[i + skip :]
                return line, True
        return "", False


@dataclass(frozen=True)
class Chunk:
    """What one stream event carries: new text (completions' `text` or chat's `delta.content`),
    a finish reason, and the usage of the whole request (the last chunk, with include_usage)."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None


def read_chunk(data: str) -> Chunk | None:
    """One event's data as a Chunk; None for the closing [DONE]."""
    if data.strip() == DONE:
        return None
    try:
        body = json.loads(data)
    except json.JSONDecodeError as exc:
        raise StreamError(f"stream event is not JSON: {data[:120]!r}") from exc
    if not isinstance(body, dict):
        raise StreamError(f"stream event is not an object: {data[:120]!r}")
    if "error" in body:
        raise StreamError(f"server error in the stream: {json.dumps(body['error'])[:300]}")
    usage = body.get("usage") or {}
    choices = body.get("choices") or []
    choice = choices[0] if choices else {}
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    tokens = usage.get("completion_tokens")
    return Chunk(text=text or "", finish_reason=choice.get("finish_reason"),
                 completion_tokens=int(tokens) if tokens is not None else None)
