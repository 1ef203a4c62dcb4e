"""What one generation (one turn of one question, one method, one repeat) leaves behind."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# a round's numbers; the last two (how many candidates the frontier offered, and the slot of
# the one the target took, -1 for none) are absent from answers written before they existed
ROUND_FIELDS = ("nodes", "depth", "accepted", "emitted", "fallback", "frontier_children", "frontier_slot")


@dataclass(frozen=True)
class TurnOutput:
    tokens: tuple[int, ...]  # new tokens, EOS included when it ended the generation
    text: str
    wall_time: float  # seconds around the whole call: prefill, decoding, stop checks
    emit_offsets: tuple[float, ...]  # seconds from the start to each emit event (a round, or one streamed token)
    accept_lengths: tuple[int, ...] | None  # tokens published per target verification step; None if unknown
    rounds: tuple[tuple[int, ...], ...] | None = None  # draftwise rounds, ROUND_FIELDS each
    phase_seconds: dict[str, float] | None = None  # draftwise phase -> total seconds
    max_kv_bytes: int | None = None  # the most KV a round held, committed rows included
    # draftwise proposer -> [rounds it proposed in, verified rows it proposed, accepted rows it proposed,
    # rounds a union's gate did not ask it (absent in answers saved before)]
    by_source: dict[str, list[int]] | None = None

    def as_dict(self) -> dict:
        return {
            "tokens": list(self.tokens),
            "text": self.text,
            "wall_time": self.wall_time,
            "emit_offsets": [round(t, 6) for t in self.emit_offsets],
            "accept_lengths": None if self.accept_lengths is None else list(self.accept_lengths),
            "rounds": None if self.rounds is None else [list(r) for r in self.rounds],
            "phase_seconds": self.phase_seconds,
            "max_kv_bytes": self.max_kv_bytes,
            "by_source": self.by_source,
        }

    @classmethod
    def from_dict(cls, row: dict) -> "TurnOutput":
        rounds = row.get("rounds")
        accept = row.get("accept_lengths")
        return cls(
            tokens=tuple(row["tokens"]),
            text=row["text"],
            wall_time=float(row["wall_time"]),
            emit_offsets=tuple(row.get("emit_offsets") or ()),
            accept_lengths=None if accept is None else tuple(accept),
            rounds=None if rounds is None else tuple(tuple(r) for r in rounds),
            phase_seconds=row.get("phase_seconds"),
            # "max_temp_kv_bytes" in answers written before the rename: the same quantity, misnamed
            max_kv_bytes=row.get("max_kv_bytes", row.get("max_temp_kv_bytes")),
            by_source=row.get("by_source"),
        )


@dataclass
class EmitClock:
    """Timestamps of emit events, taken in the generation's own callback (engine on_tokens,
    transformers streamer, llama.cpp token iterator): the latency a streaming reader sees."""

    start: float = field(default_factory=time.perf_counter)
    offsets: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def restart(self) -> None:
        self.start = time.perf_counter()
        self.offsets.clear()
        self.counts.clear()

    def emit(self, count: int) -> None:
        self.offsets.append(time.perf_counter() - self.start)
        self.counts.append(count)
