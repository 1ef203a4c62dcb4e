"""Positional acceptance: how often the j-th sibling slot is the one the verifier selects.

Two views of the same numbers:
- h_j, the *conditional* rate: P(slot j accepted | parent reached and slots < j rejected).
  This is what a sequential (SpecInfer/Sequoia) verifier measures slot by slot.
- p_j, the *positional* (selected-child) probability: P(slot j is the selected child | parent
  reached) = h_j * prod_{i<j} (1 - h_i).  Sequoia's dynamic program consumes p.

sum_j p_j <= 1; the remainder 1 - sum_j p_j is the probability that *no* child is selected
(the target's token is none of the candidates).  It is never normalized away: renormalizing
would claim acceptances that did not happen and inflate every predicted speedup.

Profiles may be depth-indexed: row k (0-based) holds the slots of children at depth k+1.
Depths deeper than the last measured row reuse the last row (a depth-1 calibration is the
common case; see `row_for_depth`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.artifacts import ArtifactError, Manifest, read_manifest, staged_artifact, write_manifest

ARTIFACT_KIND = "acceptance"
DATA_FILE = "acceptance.json"
SUM_TOLERANCE = 1e-12  # float slack on sum(p) <= 1 after h -> p products
WILSON_Z95 = 1.959963984540054  # two-sided 95% normal quantile


def selected_child_probs(h: Sequence[float]) -> np.ndarray:
    """Conditional rates h [W] -> positional probabilities p [W], p_j = h_j prod_{i<j}(1 - h_i)."""
    rates = np.asarray(h, dtype=np.float64)  # [W]
    if rates.ndim != 1:
        raise InputError(f"h must be a 1-D sequence of conditional rates, got shape {rates.shape}")
    if not np.all(np.isfinite(rates)) or np.any((rates < 0.0) | (rates > 1.0)):
        raise InputError(f"every conditional rate h_j must lie in [0, 1], got {rates.tolist()}")
    # survival[j] = prod_{i<j} (1 - h_i): the chance that slots 0..j-1 were all rejected.
    survival = np.concatenate(([1.0], np.cumprod(1.0 - rates)[:-1]))  # [W]
    return validate_positional(rates * survival)


def validate_positional(p: Sequence[float] | Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """Check a positional vector [W] (or depth-indexed matrix [D, W]); return it as float64.

    Each p_j must be in [0, 1] and each row must sum to at most 1 (+1e-12): the rest is the
    "no child selected" mass, which is kept, never normalized away.
    """
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise InputError(f"positional acceptance must be a non-empty [W] or [D, W] array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InputError(f"positional acceptance holds a non-finite value: {arr.tolist()}")
    if np.any((arr < 0.0) | (arr > 1.0)):
        raise InputError(f"every positional acceptance p_j must lie in [0, 1], got {arr.tolist()}")
    sums = arr.sum(axis=-1)  # [] or [D]
    if np.any(sums > 1.0 + SUM_TOLERANCE):
        raise InputError(
            f"positional acceptance sums to {np.max(sums):.15g} > 1: the slots are mutually exclusive "
            "outcomes of one verification step, so their probabilities cannot exceed 1 "
            "(did you pass conditional rates h instead of p? use selected_child_probs)"
        )
    return arr


def as_depth_matrix(p: Sequence[float] | Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """Validated positional acceptance as a depth-indexed matrix [D, W] (a vector becomes D = 1)."""
    arr = validate_positional(p)
    return arr[None, :] if arr.ndim == 1 else arr


def row_for_depth(matrix: np.ndarray, depth: int) -> np.ndarray:
    """Slot probabilities [W] for children at `depth` (>= 1); deeper than measured reuses the last row."""
    if depth < 1:
        raise InputError(f"children live at depth >= 1, got {depth}")
    return matrix[min(depth, matrix.shape[0]) - 1]


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (scipy's `binomtest(...).proportion_ci`,
    two-sided, at the confidence level of the normal quantile `z`); (0, 1) when there are no trials."""
    if trials <= 0:
        return (0.0, 1.0)
    from scipy.stats import binomtest  # lazy: importing scipy.stats is slow, and only calibration needs it

    confidence = math.erf(z / math.sqrt(2.0))  # two-sided level of z: P(|N(0, 1)| <= z)
    ci = binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="wilson")
    # At 0 or `trials` successes the exact bound is 0 or 1; rounding would leave a last-bit error.
    lo = 0.0 if successes == 0 else max(0.0, float(ci.low))
    hi = 1.0 if successes == trials else min(1.0, float(ci.high))
    return (lo, hi)


def _rows_from_counts(selected: Sequence[int], reached: int) -> dict[str, tuple]:
    """One depth's counts -> h, p and their Wilson intervals (as tuples, JSON-ready)."""
    counts = [int(c) for c in selected]
    if reached < 0 or any(c < 0 for c in counts):
        raise InputError(f"counts must be non-negative, got selected={counts}, reached={reached}")
    if sum(counts) > reached:
        raise InputError(f"selected counts {counts} sum to {sum(counts)} > reached {reached}: "
                         "at most one child is selected per reached parent")
    h, h_ci, p, p_ci = [], [], [], []
    at_risk = reached  # parents whose slots < j were all rejected
    for c in counts:
        # No parent ever reached slot j: no evidence, h_j = 0 with the uninformative interval.
        h.append(c / at_risk if at_risk > 0 else 0.0)
        h_ci.append(wilson_interval(c, at_risk))
        p.append(c / reached if reached > 0 else 0.0)
        p_ci.append(wilson_interval(c, reached))
        at_risk -= c
    return {"h": tuple(h), "h_interval": tuple(h_ci), "p": tuple(p), "p_interval": tuple(p_ci)}


def _per_depth(selected: Sequence[Any], reached: int | Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Accept one depth ([W] counts, int reached) or several ([D][W] counts, [D] reached)."""
    if len(selected) and isinstance(selected[0], (Sequence, np.ndarray)):
        rows = [[int(c) for c in row] for row in selected]
        reached_rows = [int(r) for r in reached] if isinstance(reached, (Sequence, np.ndarray)) else None
        if reached_rows is None or len(reached_rows) != len(rows):
            raise InputError("per-depth selected counts need one reached count per depth")
        return rows, reached_rows
    if isinstance(reached, (Sequence, np.ndarray)):
        raise InputError("one row of selected counts needs a single reached count")
    return [[int(c) for c in selected]], [int(reached)]


def _pairs(rows: Sequence[Sequence[Sequence[float]]]) -> tuple[tuple[tuple[float, float], ...], ...]:
    return tuple(tuple((float(lo), float(hi)) for lo, hi in row) for row in rows)


@dataclass(frozen=True)
class AcceptanceProfile:
    """Calibrated positional acceptance, depth-indexed: row k is children at depth k+1.

    `p` is what the optimizer uses.  `selected_counts`/`reached_counts` are the raw evidence
    (None when the profile was written by hand, e.g. a paper's vector); intervals are Wilson 95%.
    """

    p: tuple[tuple[float, ...], ...]  # [D][W]
    h: tuple[tuple[float, ...], ...]  # [D][W]
    selected_counts: tuple[tuple[int, ...], ...] | None = None  # [D][W]
    reached_counts: tuple[int, ...] | None = None  # [D]
    p_interval: tuple[tuple[tuple[float, float], ...], ...] | None = None  # [D][W] (lo, hi)
    h_interval: tuple[tuple[tuple[float, float], ...], ...] | None = None  # [D][W] (lo, hi)
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.p or not self.p[0] or len({len(row) for row in self.p}) != 1:
            raise InputError("p must hold one or more depth rows of one non-zero width")
        if len(self.h) != len(self.p) or any(len(a) != len(b) for a, b in zip(self.h, self.p)):
            raise InputError("h and p must have the same [D][W] shape")
        validate_positional(self.p)

    @property
    def matrix(self) -> np.ndarray:
        """Positional acceptance [D, W] as float64 (a fresh array; the profile stays immutable)."""
        return np.array(self.p, dtype=np.float64)

    @property
    def width(self) -> int:
        return len(self.p[0])

    @classmethod
    def from_counts(
        cls,
        selected_counts_by_slot: Sequence[int] | Sequence[Sequence[int]],
        reached_count: int | Sequence[int],
        provenance: Mapping[str, Any] | None = None,
    ) -> "AcceptanceProfile":
        """Raw calibration counts -> profile.

        selected_counts_by_slot[j]: how many reached parents had slot j as their selected child
        (or [D][W] per depth); reached_count: how many parents were reached (or [D]).
        """
        rows, reached = _per_depth(selected_counts_by_slot, reached_count)
        if len({len(r) for r in rows}) != 1 or not rows[0]:
            raise InputError("selected counts must be non-empty rows of one width")
        stats = [_rows_from_counts(r, n) for r, n in zip(rows, reached)]
        return cls(
            p=tuple(s["p"] for s in stats),
            h=tuple(s["h"] for s in stats),
            selected_counts=tuple(tuple(r) for r in rows),
            reached_counts=tuple(reached),
            p_interval=_pairs([s["p_interval"] for s in stats]),
            h_interval=_pairs([s["h_interval"] for s in stats]),
            provenance=dict(provenance or {}),
        )

    @classmethod
    def from_conditional(
        cls, h: Sequence[float] | Sequence[Sequence[float]], provenance: Mapping[str, Any] | None = None
    ) -> "AcceptanceProfile":
        """Profile from conditional rates alone (no counts, no intervals), e.g. a published h."""
        arr = np.asarray(h, dtype=np.float64)
        rows = arr[None, :] if arr.ndim == 1 else arr
        p = [selected_child_probs(row) for row in rows]
        return cls(
            p=tuple(tuple(float(x) for x in row) for row in p),
            h=tuple(tuple(float(x) for x in row) for row in rows),
            provenance=dict(provenance or {}),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "p": self.p,
            "h": self.h,
            "selected_counts": self.selected_counts,
            "reached_counts": self.reached_counts,
            "p_interval": self.p_interval,
            "h_interval": self.h_interval,
        }

    def save(self, directory: Path) -> Manifest:
        """Write the profile as an artifact directory (kind "acceptance"); return its manifest."""
        with staged_artifact(directory, ARTIFACT_KIND) as staging:
            (staging / DATA_FILE).write_text(json.dumps(self.to_json(), indent=1) + "\n")
            manifest = write_manifest(staging, ARTIFACT_KIND, self.provenance)
        return manifest

    @classmethod
    def load(cls, directory: Path) -> "AcceptanceProfile":
        """Read and verify an acceptance artifact; counts, when present, must reproduce p."""
        manifest = read_manifest(directory, kind=ARTIFACT_KIND, required=(DATA_FILE,))
        body = json.loads((Path(directory) / DATA_FILE).read_text())
        if body.get("selected_counts") is not None:
            profile = cls.from_counts(body["selected_counts"], body["reached_counts"], manifest.provenance)
            stored = np.array(body["p"], dtype=np.float64)
            if stored.shape != profile.matrix.shape or not np.allclose(stored, profile.matrix, rtol=0, atol=1e-12):
                raise ArtifactError(f"{directory}: stored p does not follow from the stored counts")
            return profile
        return cls(
            p=tuple(tuple(float(x) for x in row) for row in body["p"]),
            h=tuple(tuple(float(x) for x in row) for row in body["h"]),
            provenance=dict(manifest.provenance),
        )
