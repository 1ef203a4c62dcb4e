"""The row-padding plan a transformers backend applies to its verify forwards.

A verify forward of M rows runs as M' >= M rows where M' measured at least `margin` faster on
this machine (how it is measured and cached: `measure/row_padding.py`).  Padding rows come after
every real row and no real row sees one (the causal order, or an explicit mask); their logits are
dropped and their KV cut before anything reads the cache.  So a padded forward computes the real
rows as any forward does; only the kernel's blocking changes, as it does between any two row
counts.  Nothing is padded past `max_rows`, and an `extend` (a prompt read or a draft's catch-up,
one row's logits) is never padded: its head is one row.  A batch (`TransformersBatch`) pads by its
model's plan only its forwards over one sequence, which are this backend's forward; over several
sequences it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from draftwise.errors import InputError

DEFAULT_MARGIN = 0.05  # a padded forward must be this much faster: within noise, compute what was asked


@dataclass(frozen=True)
class RowPadding:
    """Seconds of a forward of M rows (`seconds[M - 1]`) and the padding they imply."""

    seconds: tuple[float, ...]
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if not self.seconds or any(not s > 0 for s in self.seconds):
            raise InputError(f"row padding needs a positive time for every row count, got {self.seconds}")
        if not 0.0 <= self.margin < 1.0:
            raise InputError(f"row padding margin must be in [0, 1), got {self.margin}")

    @property
    def max_rows(self) -> int:
        return len(self.seconds)

    def cost(self, rows: int) -> float | None:
        return self.seconds[rows - 1] if 1 <= rows <= self.max_rows else None

    def rows_for(self, rows: int) -> int:
        """The row count a forward of `rows` rows runs as (>= rows): read off `padded`, once
        computed (every verify forward asks)."""
        return self.padded.get(rows, rows)

    @cached_property
    def padded(self) -> dict[int, int]:
        """The row counts padded, and to what ({} where none is)."""
        plan = {m: self._scan(1, m) for m in range(1, self.max_rows + 1)}
        return {m: p for m, p in plan.items() if p != m}

    def width_for(self, sequences: int, width: int) -> int:
        """The width a forward of `sequences` x `width` rows (a batch's padded [B, R] input) runs
        as: the narrowest w >= `width` whose sequences x w rows measured within `margin` of the
        fastest of them (more rows cost more outside the products), where that is at least
        `margin` faster than `width` itself; `width` past the measured counts.  One sequence
        reads the `padded` map (a batch's every one-sequence verify asks)."""
        return self.rows_for(width) if sequences == 1 else self._scan(sequences, width)

    def _scan(self, sequences: int, width: int) -> int:
        own = self.cost(sequences * width)
        if own is None:
            return width
        costs = {}
        w = width
        while (cost := self.cost(sequences * w)) is not None:
            costs[w] = cost
            w += 1
        best = min(costs.values())
        chosen = min(w for w, cost in costs.items() if cost <= best * (1.0 + self.margin))
        return chosen if costs[chosen] < own * (1.0 - self.margin) else width

    def describe(self) -> str:
        padded = self.padded
        if not padded:
            return "no row count is padded (every count measured as fast as any larger one)"
        return "rows padded " + ", ".join(f"{m}->{p}" for m, p in padded.items())

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": list(self.seconds), "margin": self.margin}
