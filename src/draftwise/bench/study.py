"""What a study script under benchmarks/ leaves behind: results.json, report.md, the report printed."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Sequence

from draftwise.timing import noise_check


def _as_json(value: Any) -> Any:
    """A dataclass (a `timing.Spread`, ...) as its fields; anything else json cannot write is refused."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def write_study(out: Path, results: dict, lines: Sequence[str]) -> None:
    """`results` to out/results.json (dataclasses written as their fields), `lines` to out/report.md,
    and the report printed."""
    Path(out, "results.json").write_text(json.dumps(results, indent=1, default=_as_json))
    report = "\n".join(lines) + "\n"
    Path(out, "report.md").write_text(report)
    print(report, end="")


def read_noise(backend: Any, tokens: Sequence[int]) -> str:
    """How steady the machine is, described: `timing.noise_check` over a fixed short read of
    `tokens` on `backend` (reset, then extend), repeated.  A study takes it at its start and end."""

    def read() -> None:
        backend.reset()
        backend.extend(list(tokens))

    return noise_check(read).describe()
