"""What one concurrency cell (one method, B requests in flight, one repeat) leaves behind, and its file.

A cell decodes every prompt of the workload (first turns) with B requests in flight: a
request is *sent* when a lane frees up (closed loop), and its trace records when it was sent
and when each of its chunks arrived (a chunk: the tokens one round published, or one
`generate` step for transformers' padded batch).  Offsets are seconds from the cell's start.

`concurrency.jsonl` in the result directory holds one line per finished cell, one per cell
that failed as a whole, and one per (method, B) the method refused (refusals hold for every
repeat); `--resume` skips every (method, B, repeat) it finds there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from draftwise.errors import InputError

CELLS_FILE = "concurrency.jsonl"


class BatchRefused(InputError):
    """A method that cannot run with several requests in flight; the message says why."""


@dataclass(frozen=True)
class RequestTrace:
    question_id: str
    sent: float  # offset at which the request was handed to the engine (its lane freed up)
    chunk_offsets: tuple[float, ...]  # offset of each chunk that reached the client
    chunk_tokens: tuple[int, ...]  # tokens in each chunk
    tokens: tuple[int, ...]  # the request's new tokens (EOS included when it ended the request)
    error: str | None = None  # the error the request alone ended with

    @classmethod
    def from_dict(cls, row: dict) -> "RequestTrace":
        return cls(question_id=str(row["question_id"]), sent=float(row["sent"]),
                   chunk_offsets=tuple(row["chunk_offsets"]), chunk_tokens=tuple(row["chunk_tokens"]),
                   tokens=tuple(row["tokens"]), error=row.get("error"))


@dataclass(frozen=True)
class CellRun:
    """What a method's batch runner measured for one cell."""

    wall_time: float  # the cell's first send to its last token
    requests: tuple[RequestTrace, ...]
    kv_peak_bytes: int | None  # the most KV the backend held (allocated, padding included)
    kv_rows_peak_bytes: int | None  # the most KV the in-flight requests' own rows took
    rss_peak_bytes: int  # the process's resident memory, sampled at every round boundary
    forwards: int | None = None  # shared target forwards (draftwise) or generate steps (transformers)
    rows_per_forward: float | None = None  # draftwise: rows a shared forward verified, on average
    forward_seconds: float | None = None  # draftwise: time in the shared forwards (the rest: proposing, selecting, ...)


@dataclass(frozen=True)
class Cell:
    method: str
    batch: int
    repeat: int | None  # None for a refusal (it holds for every repeat)
    run: CellRun | None = None
    refused: str | None = None  # the method cannot batch: why
    error: str | None = None  # the cell failed as a whole: why

    @property
    def key(self) -> tuple[str, int, int | None]:
        return self.method, self.batch, self.repeat

    def as_dict(self) -> dict:
        row = asdict(self)
        if self.run is not None:
            for request in row["run"]["requests"]:
                request["chunk_offsets"] = [round(t, 6) for t in request["chunk_offsets"]]
        return row

    @classmethod
    def from_dict(cls, row: dict) -> "Cell":
        run = row.get("run")
        if run is not None:
            run = CellRun(**{**run, "requests": tuple(RequestTrace.from_dict(r) for r in run["requests"])})
        return cls(method=row["method"], batch=int(row["batch"]), repeat=row.get("repeat"), run=run,
                   refused=row.get("refused"), error=row.get("error"))


class CellStore:
    """concurrency.jsonl: appended (and flushed) per cell, read back whole; a line cut short by
    an interruption is dropped, so that cell runs again."""

    def __init__(self, root: Path) -> None:
        self.path = root / CELLS_FILE

    def load(self) -> list[Cell]:
        if not self.path.is_file():
            return []
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):  # keep appends whole after an interrupted write
            text = text[: text.rfind("\n") + 1]
            self.path.write_text(text, encoding="utf-8")
        cells = []
        for line in text.splitlines():
            try:
                cells.append(Cell.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        return cells

    def append(self, cell: Cell) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(cell.as_dict()) + "\n")
            handle.flush()


def is_done(cells: list[Cell], method: str, batch: int, repeat: int) -> bool:
    """Whether (method, batch, repeat) is on disk: measured, failed, or refused at that batch."""
    return any(c.method == method and c.batch == batch and (c.refused is not None or c.repeat == repeat)
               for c in cells)
