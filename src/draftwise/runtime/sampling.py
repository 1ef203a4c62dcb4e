"""One sampling policy, applied identically to the target's p and to any proposal q.

"Exact" in draftwise means: the emitted sequence has the distribution of sampling the
target alone under this policy.  Temperature 0 is greedy: the distribution is one-hot at
the first argmax, so every exact verifier reduces to greedy match.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from draftwise.errors import InputError


class PolicyError(InputError):
    """An invalid sampling parameter."""


@dataclass(frozen=True)
class SamplingPolicy:
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1.0 = no nucleus cut

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise PolicyError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise PolicyError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise PolicyError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """Policy distribution over the last axis. logits [..., V] -> float64 probs [..., V]."""
        logits = np.asarray(logits, dtype=np.float64)
        if self.greedy:
            out = np.zeros_like(logits)
            np.put_along_axis(out, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
            return out
        scaled = logits / self.temperature
        if self.top_k and self.top_k < scaled.shape[-1]:
            kth = np.partition(scaled, -self.top_k, axis=-1)[..., -self.top_k, None]
            scaled = np.where(scaled < kth, -np.inf, scaled)
        scaled = scaled - scaled.max(axis=-1, keepdims=True)
        probs = np.exp(scaled)
        probs /= probs.sum(axis=-1, keepdims=True)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        return np.asarray(probs)


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """transformers' TopPLogitsWarper rule, so draftwise and its peers cut the same tokens:
    in ascending order, drop tokens whose cumulative mass is <= 1 - top_p (the top one stays)."""
    order = np.argsort(probs, axis=-1, kind="stable")  # ascending
    cumulative = np.cumsum(np.take_along_axis(probs, order, axis=-1), axis=-1)
    drop_sorted = cumulative <= (1.0 - top_p)
    drop_sorted[..., -1] = False
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    probs = np.where(drop, 0.0, probs)
    return np.asarray(probs / probs.sum(axis=-1, keepdims=True))


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a normalized distribution [V] with an explicit generator."""
    return sample_with(probs, rng.random())


def sample_with(probs: np.ndarray, u: float) -> int:
    """The token id a uniform draw `u` in [0, 1) picks from a normalized distribution [V] (inverse CDF)."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, u * cumulative[-1], side="right"), len(probs) - 1))


@dataclass(frozen=True)
class PositionDraws:
    """One uniform draw per sequence position, a pure function of (key, position) (Philox, a
    counter-based generator: the draw at position p is the same whoever asked for which other
    positions, in whatever order).  The target's own samples are drawn with it: plain decoding
    samples the token at position p with draw p, and target-sample membership samples the same
    token at p with the same draw whatever was proposed, so at a given seed a membership-verified
    speculative decoder publishes plain decoding's text (up to the backend's rounding of the
    rows), whatever its proposer, gate, guard or batch-mates consumed of the request's
    sequential generator.  The draws of distinct positions are independent uniforms, so each
    token is still an exact sample of the target's conditional."""

    key: int  # 0 <= key < 2**64

    def __post_init__(self) -> None:
        if not 0 <= self.key < 2**64:
            raise InputError(f"a draw key is a 64-bit unsigned integer, got {self.key}")

    @classmethod
    def for_seed(cls, seed: int | None, rng: np.random.Generator) -> "PositionDraws":
        """The draws of a generation: keyed by its seed, or by a draw of its generator (no seed)."""
        return cls(int(seed) % 2**64 if seed is not None else int(rng.integers(0, 2**63)))

    def uniform(self, position: int) -> float:
        """The draw in [0, 1) for the token at sequence `position` (>= 0)."""
        if position < 0:
            raise InputError(f"a sequence position is >= 0, got {position}")
        return float(np.random.Generator(np.random.Philox(key=[self.key, position])).random())
