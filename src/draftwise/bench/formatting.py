"""How the reports write a number: '–' for unknown, floats to a fixed number of digits."""

from __future__ import annotations


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
