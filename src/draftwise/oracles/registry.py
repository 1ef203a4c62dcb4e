"""Oracle registry: small, import-light, so any module can register an oracle on import.

An oracle is a zero-argument function returning an `OracleResult`; `register` appends it to
`ORACLES` (the one piece of global mutable state in draftwise, by design) and `run_all` runs
them in registration order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OracleResult:
    name: str
    computed: float
    expected: float
    tolerance: float
    passed: bool
    detail: str


OracleFn = Callable[[], OracleResult]

ORACLES: list[OracleFn] = []


def register(fn: OracleFn) -> OracleFn:
    ORACLES.append(fn)
    return fn


def run_all() -> list[OracleResult]:
    return [fn() for fn in ORACLES]
