"""The emitter's stop-string check decodes only a trailing window; it must stop exactly where a
check over the whole text would, on text with split UTF-8 characters and zero-width tokens."""

from __future__ import annotations

import numpy as np

from draftwise.runtime.round import _Emitter

SPECIAL = 256  # decodes to nothing, like a special token with skip_special_tokens
WORDS = {257: "def ", 258: "return", 259: "\n\n", 260: "é", 261: "中文"}


class ByteDetokenizer:
    """Byte-level decoding as in GPT-2/Qwen tokenizers: ids < 256 are raw bytes, so a multi-byte
    character split across tokens decodes to replacement characters until it completes."""

    def __init__(self) -> None:
        self.decoded_tokens = 0

    def __call__(self, ids) -> str:
        self.decoded_tokens += len(ids)
        data = b"".join(bytes([i]) if i < 256 else WORDS.get(i, "").encode() for i in ids)
        return data.decode("utf-8", errors="replace")


def stream(rng: np.random.Generator, length: int) -> list[int]:
    """Mostly ASCII bytes and words, with runs of specials and multi-byte characters byte by byte."""
    out: list[int] = []
    while len(out) < length:
        kind = rng.integers(6)
        if kind == 0:
            out.extend([SPECIAL] * int(rng.integers(1, 40)))
        elif kind == 1:
            out.extend("é中🙂".encode()[: int(rng.integers(1, 10))])  # sometimes cut mid-character
        elif kind == 2:
            out.append(int(rng.choice(list(WORDS))))
        else:
            out.extend(int(b) for b in rng.choice(list(b"abc x\n"), size=int(rng.integers(1, 6))))
    return out[:length]


def whole_text_stop(tokens, stops, detokenize) -> int | None:
    """The oracle: the first prefix length whose full decoded text holds a stop string."""
    for n in range(1, len(tokens) + 1):
        text = detokenize(tokens[:n])
        if any(s in text for s in stops):
            return n
    return None


def emitted(tokens, stops, detokenize) -> tuple[int, str | None]:
    emitter = _Emitter(limit=10**6, eos=frozenset(), stop_strings=tuple(stops), detokenize=detokenize)
    return emitter.publish(tokens, [False] * len(tokens)), emitter.stop_reason


def test_windowed_check_stops_where_the_whole_text_check_does():
    rng = np.random.default_rng(7)
    stopped = 0
    for case in range(300):
        tokens = stream(rng, 150)
        full = ByteDetokenizer()(tokens)
        if case % 3 == 0:
            stops = ["zzz", "qé"]  # never present: the check must run to the end and stop nowhere
        else:  # a substring of the text, often spanning specials or a split character
            start = int(rng.integers(0, max(1, len(full) - 8)))
            stops = [full[start:start + int(rng.integers(1, 9))]]
        expected = whole_text_stop(tokens, stops, ByteDetokenizer())
        count, reason = emitted(tokens, stops, ByteDetokenizer())
        if expected is None:
            assert (count, reason) == (len(tokens), None), (case, stops)
        else:
            stopped += 1
            assert (count, reason) == (expected, "stop_string"), (case, stops)
    assert stopped > 150  # the oracle comparison covered real stops, not only misses


def test_check_cost_grows_with_the_window_not_the_text():
    tokens = [ord("a")] * 4000
    detokenize = ByteDetokenizer()
    count, reason = emitted(tokens, ["stop"], detokenize)
    assert (count, reason) == (4000, None)
    # a whole-text check would decode 4000 * 4001 / 2 = 8M tokens
    assert detokenize.decoded_tokens < 30 * 4000
