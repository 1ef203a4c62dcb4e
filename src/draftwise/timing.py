"""Timings that hold on a shared machine: warm-up, interleaved repeats, medians with a spread,
and a noise check that says when a measurement cannot be trusted.

One timing of one run can be off by a multiple on a shared machine (a background process, a
cold cache, a CPU frequency step), and timing a method and then its baseline once each lets that land on one
side only.  So every comparison this module makes (a) warms each side up first, (b) alternates
the sides, one pair per repeat, with the order rotated so that neither always runs first, (c)
reports the median of the per-pair ratios with their range, and (d) runs a noise check: the
coefficient of variation of a fixed, repeated step.  A check over its limit marks the
measurement unreliable; callers say so and cache nothing measured then.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from draftwise.errors import InputError

# a fixed step whose repeats vary by more than this (stdev / mean) ran on a busy machine
DEFAULT_MAX_CV = 0.10
DEFAULT_REPEATS = 3


@dataclass(frozen=True)
class Spread:
    """The median of some measurements and their range."""

    median: float
    low: float
    high: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        if not values:
            raise InputError("a spread of no measurements")
        return cls(float(statistics.median(values)), float(min(values)), float(max(values)),
                   tuple(float(v) for v in values))

    @property
    def relative_range(self) -> float:
        """(high - low) / median: 0.2 is a band of a tenth of the median either side."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def describe(self, unit: str = "", digits: int = 2) -> str:
        return (f"{self.median:.{digits}f}{unit} (range {self.low:.{digits}f}-{self.high:.{digits}f}{unit}, "
                f"{len(self.samples)} runs)")

    def cell(self, digits: int = 2) -> str:
        """'median (low-high)': a report table's cell."""
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


@dataclass(frozen=True)
class NoiseCheck:
    """How steady a fixed, repeated step ran: its coefficient of variation, and the load average."""

    cv: float  # stdev / mean of the step's seconds
    seconds: tuple[float, ...]
    load_per_core: float  # the 1-minute load average over the cores (what else ran, us included)
    max_cv: float

    @property
    def reliable(self) -> bool:
        return self.cv <= self.max_cv

    def describe(self) -> str:
        verdict = "ok" if self.reliable else "UNRELIABLE (the machine was busy: repeat on an idle machine)"
        return (f"{verdict}: a repeated step varied {100 * self.cv:.1f}% (limit {100 * self.max_cv:.0f}%), "
                f"load {self.load_per_core:.2f} per core")


def noise_check(step: Callable[[], object], repeats: int = 5, max_cv: float = DEFAULT_MAX_CV) -> NoiseCheck:
    """Time `step` `repeats` times after one untimed call."""
    if repeats < 3:
        raise InputError(f"a noise check needs at least 3 repeats, got {repeats}")
    step()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    mean = statistics.fmean(seconds)
    cv = statistics.stdev(seconds) / mean if mean > 0 else float("inf")
    return NoiseCheck(cv, tuple(seconds), _load_per_core(), max_cv)


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return float("nan")


@dataclass(frozen=True)
class Comparison:
    """Interleaved repeats of several runs: each run's values per repeat, and ratios per pair."""

    values: Mapping[str, tuple[float, ...]]  # name -> one value per repeat (e.g. tokens per second)
    noise: NoiseCheck | None

    def spread(self, name: str) -> Spread:
        return Spread.of(self.values[name])

    def ratio(self, name: str, baseline: str) -> Spread:
        """Per-repeat ratios name / baseline (each pair ran back to back), their median and range."""
        return Spread.of([a / b for a, b in zip(self.values[name], self.values[baseline]) if b > 0])


def interleaved(runs: Mapping[str, Callable[[], float]], repeats: int = DEFAULT_REPEATS,
                warmups: Mapping[str, Callable[[], object]] | None = None,
                noise: Callable[[], NoiseCheck] | None = None) -> Comparison:
    """Every run once per repeat, back to back, the order rotated each repeat (so no run is
    always first); each returns its measured value.  `warmups` run once, untimed, before the
    first repeat; `noise` (a `noise_check`) after the warm-ups."""
    if repeats < 1:
        raise InputError(f"repeats must be >= 1, got {repeats}")
    if not runs:
        raise InputError("nothing to compare")
    for warm in (warmups or {}).values():
        warm()
    check = noise() if noise is not None else None
    names = list(runs)
    values: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            values[name].append(float(runs[name]()))
    return Comparison({name: tuple(v) for name, v in values.items()}, check)
