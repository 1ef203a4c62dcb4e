"""summary.json's "concurrency" part: one row per (method, B) from concurrency.jsonl, or the refusal."""

from __future__ import annotations

from typing import Sequence

from draftwise.bench.cells import Cell
from draftwise.bench.concurrency_metrics import cell_row
from draftwise.bench.store import Answer

Tokens = dict[str, tuple[int, ...]]  # question_id -> a single-request answer's first-turn tokens


def first_turn_tokens(answers: dict[str, Answer]) -> Tokens:
    return {q: a.turns[0].tokens for q, a in answers.items() if not a.error and a.turns}


def concurrency_summary(cells: Sequence[Cell], methods: Sequence[str], levels: Sequence[int],
                        single: dict[str, Tokens] | None, references: dict[str, str | None]) -> dict:
    """`single`: each method's single-request first-turn tokens (None: not compared); `references`: each method's plain reference (its family's), whose rows at the
    same B give the `vs_reference` throughput ratio and whose single answers the plain check."""
    table: dict[str, dict[str, dict]] = {}
    for name in methods:
        table[name] = {}
        for batch in levels:
            refused = next((c.refused for c in cells if c.method == name and c.batch == batch and c.refused), None)
            mine = [c for c in cells if c.method == name and c.batch == batch and c.refused is None]
            if refused is not None:
                table[name][str(batch)] = {"refused": refused}
            elif mine:
                reference = references.get(name)
                table[name][str(batch)] = cell_row(mine, None if single is None else single.get(name),
                                                   None if single is None or reference is None else single.get(reference))
    for name, rows in table.items():  # throughput against the plain reference at the same B
        reference = references.get(name)
        for level, row in rows.items():
            theirs = table.get(reference or "", {}).get(level, {}).get("total_tokens_per_s")
            rate = row.get("total_tokens_per_s")
            row["vs_reference"] = round(rate / theirs, 4) if rate is not None and theirs else None
    return {"levels": list(levels), "references": {n: references.get(n) for n in methods}, "methods": table}
