"""Kangaroo's exit layer l and early-exit threshold eta, chosen by measured time per committed
token (docs/drafters.md, "Kangaroo"; the paper picks them the same way, by speed, not acceptance).

Each candidate adapter (one per exit layer: `draftwise adapter train --set exit_layer=l`) is
decoded with every eta of the grid on the development prompts, greedy, and f = wall seconds
per committed token is measured as the skip search measures it (`skip_search.seconds_per_token`:
draft, verify and state costs inside the wall time); plain decoding is measured in the same run.
The result names the fastest (adapter, eta) and keeps every measurement.  `draftwise adapter
tune` and `eta=auto` (`optimize.kangaroo_auto`) measure the same grid by default, `ETA_GRID`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

from draftwise.backends.transformers import TransformersBackend
from draftwise.errors import InputError
from draftwise.optimize.skip_search import seconds_per_token
from draftwise.proposers.base import Proposer
from draftwise.proposers.family import DrafterResources
from draftwise.proposers.kangaroo import KangarooConfig, open_kangaroo
from draftwise.runtime.sampling import SamplingPolicy

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

# the early-exit thresholds compared by default: the paper's 0.6 and its neighbours (eta = 0, no
# early exit, is k-token chains, which the shallow draft rarely pays for)
ETA_GRID: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)


class Measure(Protocol):
    """f (seconds per committed token over `prompts`) and what it was made of (`tokens`,
    `accepted`, ...): `seconds_per_token`, or a stand-in that a test controls."""

    def __call__(self, target: TransformersBackend, proposers: list[Proposer], prompts: Sequence[Sequence[int]],
                 max_new_tokens: int, policy: SamplingPolicy = ..., verifier: str = ...
                 ) -> tuple[float, dict[str, float]]: ...


@dataclass(frozen=True)
class KangarooChoice:
    adapter: Path
    eta: float
    f: float  # seconds per committed token of the choice
    plain: float  # of plain decoding, same prompts, same run
    table: tuple[dict[str, Any], ...]  # every (adapter, exit layer, eta, f, accepted, tokens)


def tune_kangaroo(target: TransformersBackend, adapters: Sequence[Path], etas: Sequence[float],
                  prompts: Sequence[Sequence[int]], max_new_tokens: int, base: KangarooConfig = KangarooConfig(),
                  policy: SamplingPolicy = SamplingPolicy(), verifier: str = "greedy",
                  measure: Measure = seconds_per_token) -> KangarooChoice:
    """Every (adapter, eta) measured under `policy` and `verifier` with `base`'s other settings
    (k, tree, relation, reuse), and plain decoding."""
    if not adapters or not etas or not prompts:
        raise InputError("tuning needs at least one adapter, one eta and one prompt")
    plain, _ = measure(target, [], prompts, max_new_tokens, policy=policy, verifier=verifier)
    log.info("kangaroo tune: plain f=%.4f s/token", plain)
    rows = []
    for adapter in adapters:
        for eta in etas:
            config = replace(base, adapter=str(adapter), eta=eta)
            proposer = open_kangaroo(config, DrafterResources(target))
            # its reusing view verifies
            f, detail = measure(target, [proposer], prompts, max_new_tokens, policy=policy, verifier=verifier)
            exit_layer = proposer.identity()["exit_layer"]
            rows.append({"adapter": str(adapter), "exit_layer": exit_layer, "eta": eta, "f": f, **detail})
            log.info("kangaroo tune: exit layer %s, eta %.2f: f=%.4f s/token (%.0f accepted / %.0f tokens)",
                     exit_layer, eta, f, detail["accepted"], detail["tokens"])
    best = min(rows, key=lambda row: row["f"])
    return KangarooChoice(Path(best["adapter"]), float(best["eta"]), float(best["f"]), plain, tuple(rows))
