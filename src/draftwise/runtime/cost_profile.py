"""Verification cost profile: how long the target takes to verify n rows at once.

The numbers are measured elsewhere (timing a backend); this module only holds, checks,
stores and interpolates them.  `n` is the number of rows in one verification call, which
for a tree is its node count *including* the root (pending token), the same `n` as in
`sequoia_dp`.  `relative[i]` is in units of one plain decoding step (t(1) = 1 when n = 1 was
measured), so that G / t(n) is directly a speedup over decoding without speculation.

Interpolation is piecewise linear in n through the medians themselves.  They need not be
monotone, and are not forced to be: llama.cpp's CPU kernels work on blocks of rows, so a
verify of a whole block can take less time than one of a row fewer (docs/trees-and-planning.md,
`draftwise profile`), which a tree of that many rows can use.  A running-maximum envelope,
used before, priced every n above such a dip (or above a noise spike) at the spike's cost, and
so predicted wide rounds slower than they ran.
Noise is kept down where it is measured (`measure.profile` spreads the repeats over passes).
Row counts outside the measured range are refused, not extrapolated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.artifacts import Manifest, read_manifest, staged_artifact, write_manifest

ARTIFACT_KIND = "verify_profile"
DATA_FILE = "verify_profile.json"


@dataclass(frozen=True)
class VerifyCostProfile:
    """Median verification time per row count, relative (plain step = 1) and absolute (s)."""

    rows: tuple[int, ...]  # [K] measured row counts, strictly increasing
    relative: tuple[float, ...]  # [K] median t(n) in plain-decoding steps
    absolute_s: tuple[float, ...] | None  # [K] median seconds, None for a hand-written profile
    model: str
    backend: str
    threads: int
    machine: str
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.relative):
            raise InputError("rows and relative must be non-empty and of the same length")
        if self.absolute_s is not None and len(self.absolute_s) != len(self.rows):
            raise InputError("absolute_s must have one median per row count")
        if self.rows[0] < 1 or any(b <= a for a, b in zip(self.rows, self.rows[1:])):
            raise InputError(f"row counts must be >= 1 and strictly increasing, got {self.rows}")
        values = list(self.relative) + list(self.absolute_s or ())
        if not all(np.isfinite(v) and v > 0 for v in values):
            raise InputError("verification times must be finite and positive")

    @classmethod
    def from_absolute(
        cls, rows: Sequence[int], absolute_s: Sequence[float], *, model: str, backend: str,
        threads: int, machine: str, provenance: Mapping[str, Any] | None = None,
    ) -> "VerifyCostProfile":
        """Medians in seconds -> profile with relative = t(n) / t(1); n = 1 must be measured."""
        order = np.argsort(rows)
        rows_sorted = tuple(int(rows[i]) for i in order)
        secs = tuple(float(absolute_s[i]) for i in order)
        if rows_sorted[0] != 1:
            raise InputError("relative times are in plain-decoding steps: measure n = 1 too")
        return cls(rows=rows_sorted, relative=tuple(s / secs[0] for s in secs), absolute_s=secs,
                   model=model, backend=backend, threads=int(threads), machine=machine,
                   provenance=dict(provenance or {}))

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    def _interpolate(self, n: float, medians: Sequence[float]) -> float:
        if not self.rows[0] <= n <= self.rows[-1]:
            raise InputError(f"no verification time for n = {n}: measured {self.rows[0]}..{self.rows[-1]} only")
        return float(np.interp(n, np.asarray(self.rows, dtype=np.float64), np.asarray(medians, dtype=np.float64)))

    def relative_at(self, n: float) -> float:
        """t(n) in plain-decoding steps; pass this as `profile_t` to `select.optimize_tree`."""
        return self._interpolate(n, self.relative)

    def relative_many(self, n: np.ndarray) -> np.ndarray:
        """t(n) in plain-decoding steps for each of `n` [C]; inf where n is beyond the measured rows."""
        n = np.asarray(n, dtype=np.float64)
        if (n < self.rows[0]).any():
            raise InputError(f"no verification time below n = {self.rows[0]}")
        rows = np.asarray(self.rows, dtype=np.float64)
        return np.where(n <= rows[-1], np.interp(n, rows, np.asarray(self.relative, dtype=np.float64)), np.inf)

    def absolute_at(self, n: float) -> float:
        if self.absolute_s is None:
            raise InputError("this profile has no absolute times")
        return self._interpolate(n, self.absolute_s)

    def to_json(self) -> dict[str, Any]:
        """The profile as JSON-shaped data (lists, not tuples), so that it compares equal to itself
        read back from a file."""
        return {"rows": list(self.rows), "relative": list(self.relative),
                "absolute_s": None if self.absolute_s is None else list(self.absolute_s),
                "model": self.model, "backend": self.backend, "threads": self.threads,
                "machine": self.machine}

    def save(self, directory: Path) -> Manifest:
        """Write an artifact directory (kind "verify_profile"); return its manifest."""
        body = self.to_json()
        meta = {k: body[k] for k in ("model", "backend", "threads", "machine")}
        with staged_artifact(directory, ARTIFACT_KIND) as staging:
            (staging / DATA_FILE).write_text(json.dumps(body, indent=1) + "\n")
            manifest = write_manifest(staging, ARTIFACT_KIND, {**dict(self.provenance), **meta})
        return manifest

    @classmethod
    def load(cls, directory: Path) -> "VerifyCostProfile":
        """Read and verify a verify_profile artifact (checksums re-checked)."""
        manifest = read_manifest(directory, kind=ARTIFACT_KIND, required=(DATA_FILE,))
        return cls.from_json(json.loads((Path(directory) / DATA_FILE).read_text()), manifest.provenance)

    @classmethod
    def from_json(cls, body: Mapping[str, Any], provenance: Mapping[str, Any]) -> "VerifyCostProfile":
        """The profile `to_json` wrote, with the provenance of the manifest it was read under."""
        absolute = body.get("absolute_s")
        return cls(
            rows=tuple(int(n) for n in body["rows"]),
            relative=tuple(float(v) for v in body["relative"]),
            absolute_s=None if absolute is None else tuple(float(v) for v in absolute),
            model=body["model"], backend=body["backend"], threads=int(body["threads"]),
            machine=body["machine"], provenance=dict(provenance),
        )


BATCH_ARTIFACT_KIND = "batch_verify_profile"
BATCH_DATA_FILE = "batch_verify_profile.json"


@dataclass(frozen=True)
class BatchCostProfile:
    """t_B(n) for each measured batch size B: the time of one shared forward in which each of B
    requests verifies n rows, relative to the same B requests verifying 1 row each (a plain
    batched step).  The batch regime is part of the profile's identity: its batch sizes are in
    its manifest, beside the model, backend, threads and machine of every per-B profile."""

    by_batch: Mapping[int, VerifyCostProfile]  # B -> t_B(n), relative to a plain batched step

    def __post_init__(self) -> None:
        if not self.by_batch or min(self.by_batch) < 1:
            raise InputError("a batch profile needs batch sizes >= 1")

    def at(self, batch: int) -> VerifyCostProfile:
        """The profile of the largest measured batch size <= `batch` (the smallest one below it):
        a batch between two measured sizes is priced like the smaller, whose extra rows cost less."""
        below = [b for b in self.by_batch if b <= batch]
        return self.by_batch[max(below) if below else min(self.by_batch)]

    def save(self, directory: Path) -> Manifest:
        body = {str(b): profile.to_json() for b, profile in sorted(self.by_batch.items())}
        first = next(iter(self.by_batch.values()))
        meta = {"model": first.model, "backend": first.backend, "threads": first.threads, "machine": first.machine,
                "batch_sizes": sorted(self.by_batch)}
        provenance = {**dict(first.provenance), **meta}
        with staged_artifact(directory, BATCH_ARTIFACT_KIND) as staging:
            (staging / BATCH_DATA_FILE).write_text(json.dumps(body, indent=1) + "\n")
            manifest = write_manifest(staging, BATCH_ARTIFACT_KIND, provenance)
        return manifest

    @classmethod
    def load(cls, directory: Path) -> "BatchCostProfile":
        """Read and verify a batch_verify_profile artifact (checksums re-checked)."""
        manifest = read_manifest(directory, kind=BATCH_ARTIFACT_KIND, required=(BATCH_DATA_FILE,))
        body = json.loads((Path(directory) / BATCH_DATA_FILE).read_text())
        return cls({int(b): VerifyCostProfile.from_json(item, manifest.provenance) for b, item in body.items()})
