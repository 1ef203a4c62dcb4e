"""Stop strings left out of the answer, as OpenAI's API does.

The engine stops at the token that completes a stop string, and its text holds the string
(and whatever else that token spelled).  A client gets the text before the first stop string;
a stream holds back a tail that may be the start of one until the next tokens settle it, so
the streamed pieces add up to exactly the text a non-streamed request returns.
"""

from __future__ import annotations

from typing import Sequence


def cut_at_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the first stop string begins in `text` (searching from `start`), or None."""
    found = [i for s in stops if (i := text.find(s, max(0, start - len(s) + 1))) >= 0]
    return min(found) if found else None


class StopText:
    """The answer's text as it grows: `feed` each new piece, get what may be shown now."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self.text = ""  # everything the engine has given so far
        self.sent = 0  # characters of `text` handed out
        self.stopped = False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.stopped:
            return ""
        cut = cut_at_stop(self.text, self._stops, self.sent)
        if cut is not None:
            self.stopped = True
            return self._give(cut)
        return self._give(len(self.text) - self._held())

    def finish(self, final: str) -> str:
        """The rest of the answer, given the engine's whole text (`final`)."""
        cut = cut_at_stop(final, self._stops)  # the sent text holds none: the first one is the cut
        self.text, self.stopped = final, True
        return self._give(len(final) if cut is None else cut)

    def _give(self, end: int) -> str:
        piece = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece

    def _held(self) -> int:
        """The longest tail of the unsent text that begins some stop string."""
        unsent = len(self.text) - self.sent
        for size in range(min(unsent, max((len(s) for s in self._stops), default=1) - 1), 0, -1):
            tail = self.text[-size:]
            if any(s.startswith(tail) for s in self._stops):
                return size
        return 0
