"""Text that reaches a tokenizer: one rule for text that is not valid UTF-8, on every backend.

Python hands over bytes that are not UTF-8 (a shell argument holding 0xff, a file read with
`surrogateescape`) as lone surrogates ('\\udcff'); JSON may spell a lone surrogate too
('"\\ud800"').  No tokenizer can encode them, and they would fail deep inside one (llama.cpp:
a UnicodeEncodeError; transformers: whatever its tokenizer does).  Draftwise refuses such text
up front, naming what it is and where the first bad character sits, so the CLI, the Python
API and any later surface say the same thing.  Nothing is replaced silently: a prompt with a
replacement character in it would be another prompt than the one given.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from draftwise.errors import InputError


def utf8_bytes(text: str, what: str = "prompt") -> bytes:
    """`text` encoded as UTF-8; InputError ("{what} is not valid UTF-8: ... at character N")
    when it holds a lone surrogate."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be text (str), got {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid UTF-8: {_describe(text[exc.start])} at character {exc.start}") from None


def check_utf8(text: str, what: str = "prompt") -> str:
    """`text` itself, once `utf8_bytes` accepts it."""
    utf8_bytes(text, what)
    return text


def check_messages(messages: Sequence[Mapping[str, object]]) -> None:
    """Chat messages whose text fields (role, content) are all valid UTF-8."""
    for number, message in enumerate(messages):
        for key in ("role", "content"):
            value = message.get(key)
            if isinstance(value, str):
                check_utf8(value, f"chat message {number} {key}")


def _describe(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # how Python's surrogateescape carries an undecodable byte
        return f"byte 0x{code - 0xDC00:02x} (surrogate escape {char!a})"
    return f"lone surrogate U+{code:04X}"
