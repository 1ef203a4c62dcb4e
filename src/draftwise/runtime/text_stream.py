"""Incremental detokenization: the text a round's tokens add, as rounds commit them."""

from __future__ import annotations

from typing import Callable, Collection, Sequence, TextIO


class TextPieces:
    """Turns committed tokens into the text they add, decoding only since the last finished
    line (re-decoding the whole output each round is quadratic in its length); text that ends
    in an incomplete multi-byte character waits for the next round, as transformers'
    TextStreamer does.  EOS tokens are not text."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], eos_token_ids: Collection[int]) -> None:
        self._detokenize, self._eos = detokenize, eos_token_ids
        self._tokens: list[int] = []  # since the last finished line
        self._shown = 0  # characters of decode(self._tokens) already given out

    def feed(self, tokens: Sequence[int]) -> str:
        self._tokens.extend(t for t in tokens if t not in self._eos)
        text = self._detokenize(self._tokens)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self._shown:]
        if text.endswith("\n"):
            self._tokens, self._shown = [], 0
        else:
            self._shown = len(text)
        return piece

    def finish(self) -> str:
        """What an incomplete character held back at the end of the generation."""
        return self._detokenize(self._tokens)[self._shown:]


class TextStream:
    """Writes generated text to `out` as rounds commit it."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], eos_token_ids: Collection[int], out: TextIO) -> None:
        self._pieces, self._out = TextPieces(detokenize, eos_token_ids), out

    def on_tokens(self, tokens: list[int]) -> None:
        piece = self._pieces.feed(tokens)
        if piece:
            self._out.write(piece)
            self._out.flush()

    def finish(self) -> None:
        self._out.write(self._pieces.finish())
        self._out.flush()
