"""`draftwise bench compare A B`: how each method changed between two result directories.

Ratios are B / A: above 1, B has more of it (faster for tok/s and speedup, accepts more,
but SLOWER for ms_per_token).  Methods are matched by name; one present on a single side is
listed as added or removed.  A method whose two sides answered different numbers of
questions, or were measured against different references, is compared anyway and flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FIELDS = ("tokens_per_s", "speedup", "mean_accepted", "ms_per_token")


@dataclass(frozen=True)
class MethodChange:
    method: str
    scope: str  # "overall" or a category
    a: dict[str, float | None]
    b: dict[str, float | None]
    ratio: dict[str, float | None]  # B / A per field
    mismatches: tuple[int | None, int | None]


def load_summary(root: Path) -> dict:
    path = root / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run `draftwise bench` into {root} first")
    return json.loads(path.read_text())


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return round(b / a, 4)


def _change(method: str, scope: str, a: dict, b: dict) -> MethodChange:
    return MethodChange(
        method=method,
        scope=scope,
        a={f: a.get(f) for f in FIELDS},
        b={f: b.get(f) for f in FIELDS},
        ratio={f: _ratio(a.get(f), b.get(f)) for f in FIELDS},
        mismatches=(a.get("mismatches"), b.get("mismatches")),
    )


def compare(a: dict, b: dict, categories: bool = False) -> tuple[list[MethodChange], list[str], list[str]]:
    """(changes of methods in both, methods only in A, methods only in B)."""
    changes = []
    both = [m for m in a["methods"] if m in b["methods"]]
    for name in both:
        ma, mb = a["methods"][name], b["methods"][name]
        if not ma["overall"]["questions"] or not mb["overall"]["questions"]:
            continue
        changes.append(_change(name, "overall", ma["overall"], mb["overall"]))
        if categories:
            for cat in ma["categories"]:
                if cat in mb["categories"] and ma["categories"][cat]["questions"] and mb["categories"][cat]["questions"]:
                    changes.append(_change(name, cat, ma["categories"][cat], mb["categories"][cat]))
    only_a = [m for m in a["methods"] if m not in b["methods"]]
    only_b = [m for m in b["methods"] if m not in a["methods"]]
    return changes, only_a, only_b


def settings_differences(a: dict, b: dict) -> list[str]:
    """Settings that make the two runs not like-for-like (the comparison still runs)."""
    sa, sb = a.get("settings", {}), b.get("settings", {})
    return [f"{k}: {sa.get(k)} -> {sb.get(k)}" for k in sorted(set(sa) | set(sb)) if k != "methods" and sa.get(k) != sb.get(k)]


def method_differences(a: dict, b: dict) -> list[str]:
    """Methods in both runs whose numbers are not like-for-like: other question counts (a
    partial run against a full one) or another plain reference."""
    lines = []
    for name in (m for m in a["methods"] if m in b["methods"]):
        ma, mb = a["methods"][name], b["methods"][name]
        qa, qb = ma["overall"]["questions"], mb["overall"]["questions"]
        if qa != qb:
            lines.append(f"{name}: {qa} questions in A, {qb} in B (the ratios compare different question sets)")
        if ma.get("reference") != mb.get("reference"):
            lines.append(f"{name}: speedup over {ma.get('reference')} in A, over {mb.get('reference')} in B")
    return lines
