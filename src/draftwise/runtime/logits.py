"""What a verify forward returns, as verifiers read it: a neutral type shared by the
backends (which produce it) and the verifiers (which read it), so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Protocol, TypeVar

import numpy as np

from draftwise.runtime.sampling import SamplingPolicy

K = TypeVar("K", bound=Hashable)


class TargetLogits(Protocol):
    """Target outputs for one verified round: row 0 = frontier, row r + 1 = candidate row r.

    Verifiers read probabilities through `probs` alone, one row at a time, in the order their
    walk reaches the rows.  How rows are produced is the implementation's business: logits on
    an accelerator compute every row in one batched pass at the first call and cross to the
    host once (one sync per round, not one per node); host logits compute each row when first
    asked, so a walk that stops early pays only for the rows it visited.
    """

    def argmax(self) -> np.ndarray:  # [1 + N] int64, first maximum
        ...

    def probs(self, row: int, policy: SamplingPolicy) -> np.ndarray:  # [V] float64, policy applied, read-only
        ...


@dataclass(frozen=True)
class NumpyLogits:
    """TargetLogits over a host array [1 + N, V] (a view is fine: nothing writes to it)."""

    logits: np.ndarray
    _rows: dict[tuple[SamplingPolicy, int], np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)  # (policy, row) -> [V]

    def argmax(self) -> np.ndarray:
        return np.asarray(self.logits.argmax(axis=-1))

    def probs(self, row: int, policy: SamplingPolicy) -> np.ndarray:
        return cached(self._rows, (policy, row), lambda: policy.probs(self.logits[row]))  # [V]

    def probs_all(self, policy: SamplingPolicy) -> np.ndarray:  # [1 + N, V], the reference for every row
        return policy.probs(self.logits)


def cached(cache: dict[K, np.ndarray], key: K, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """cache[key], computed by `compute()` on first use and made read-only: the rows are shared
    by everything that reads this round, and a verifier writing into one would corrupt the rest."""
    value = cache.get(key)
    if value is None:
        value = compute()
        value.flags.writeable = False
        cache[key] = value
    return value


