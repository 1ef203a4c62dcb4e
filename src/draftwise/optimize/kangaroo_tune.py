"""Kangaroo's exit layer l and early-exit threshold eta, chosen by measured time per committed
token (HEADS.md section 7; the paper picks them the same way, by speed, not acceptance).

Each candidate adapter (one per exit layer: `draftwise adapter train --set exit_layer=l`) is
decoded with every eta of the grid on the development prompts, greedy, and f = wall seconds
per committed token is measured as the skip search measures it (`skip_search.seconds_per_token`:
draft, verify and state costs inside the wall time); plain decoding is measured in the same run.
The result names the fastest (adapter, eta) and keeps every measurement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from draftwise.backends.transformers import TransformersBackend
from draftwise.errors import InputError
from draftwise.optimize.skip_search import seconds_per_token
from draftwise.proposers.family import DrafterResources
from draftwise.proposers.kangaroo import KangarooConfig, open_kangaroo

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)


@dataclass(frozen=True)
class KangarooChoice:
    adapter: Path
    eta: float
    f: float  # seconds per committed token of the choice
    plain: float  # of plain decoding, same prompts, same run
    table: tuple[dict[str, Any], ...]  # every (adapter, exit layer, eta, f, accepted, tokens)


def tune_kangaroo(target: TransformersBackend, adapters: Sequence[Path], etas: Sequence[float],
                  prompts: Sequence[Sequence[int]], max_new_tokens: int, base: KangarooConfig = KangarooConfig()
                  ) -> KangarooChoice:
    if not adapters or not etas or not prompts:
        raise InputError("tuning needs at least one adapter, one eta and one prompt")
    plain, _ = seconds_per_token(target, [], prompts, max_new_tokens)
    log.info("kangaroo tune: plain f=%.4f s/token", plain)
    rows = []
    for adapter in adapters:
        for eta in etas:
            config = KangarooConfig(adapter=str(adapter), k=base.k, eta=eta, reuse=base.reuse)
            proposer = open_kangaroo(config, DrafterResources(target))
            f, detail = seconds_per_token(target, [proposer], prompts, max_new_tokens)  # its reusing view verifies
            exit_layer = proposer.identity()["exit_layer"]
            rows.append({"adapter": str(adapter), "exit_layer": exit_layer, "eta": eta, "f": f, **detail})
            log.info("kangaroo tune: exit layer %s, eta %.2f: f=%.4f s/token (%.0f accepted / %.0f tokens)",
                     exit_layer, eta, f, detail["accepted"], detail["tokens"])
    best = min(rows, key=lambda row: row["f"])
    return KangarooChoice(Path(best["adapter"]), float(best["eta"]), float(best["f"]), plain, tuple(rows))
