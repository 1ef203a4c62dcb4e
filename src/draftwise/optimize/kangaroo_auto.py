"""`--proposer kangaroo` with `eta=auto` and/or `adapter=auto`: the early-exit threshold and the
exit layer (one adapter per exit layer) chosen before decoding by measured seconds per committed
token, as `draftwise adapter tune` chooses them (`tune_kangaroo`, the same default grid
`ETA_GRID`), on the calibration prompts `draftwise.plan` gives every `auto`, with a small
token budget (a choice that takes longer to measure than it saves would defeat its purpose).

The measurements and the choice are an artifact under `CACHE_ROOT/kangaroo/<hash>`, keyed by
everything the timings depend on: target checkpoint and tokenizer, backend, dtype, thread count,
sampling policy and verifier, the calibration prompts, every candidate adapter (path and manifest
hash), the grid, the drafter's other settings and the token budget.  It is reused only when its
manifest verifies and its provenance names that same configuration; a tampered or foreign one is
measured again.  When plain decoding measured faster than every candidate the choice says so
(`plain_wins`), and the caller decodes without a drafter.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from draftwise.artifacts import read_manifest, staged_artifact, stable_hash, write_manifest
from draftwise.backends.base import Backend
from draftwise.backends.transformers import TransformersBackend
from draftwise.errors import ArtifactError, BackendError
from draftwise.optimize.calibrate import calibration_hash
from draftwise.optimize.kangaroo_tune import ETA_GRID, Measure, tune_kangaroo
from draftwise.optimize.skip_search import seconds_per_token
from draftwise.options import config_items
from draftwise.proposers.kangaroo import AutoAdapter, AutoEta, KangarooConfig
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.selfdraft.adapter import KIND as ADAPTER_KIND, adapters_for, default_adapter

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

KIND = "kangaroo_auto"
DATA = "kangaroo_auto.json"
OBJECTIVE = "wall seconds per committed token, summed over the calibration prompts"


@dataclass(frozen=True)
class KangarooAutoSettings:
    etas: tuple[float, ...] = ETA_GRID  # measured when eta=auto (a given eta is measured alone)
    max_new_tokens: int = 24  # per calibration prompt and candidate: a few chains each, a few seconds in all
    adapter_roots: tuple[Path, ...] | None = None  # where adapter=auto looks (None: shipped, then the cache)


@dataclass(frozen=True)
class KangarooAutoChoice:
    adapter: Path | None  # None: plain decoding measured faster than every candidate
    eta: float | None
    f: float  # seconds per committed token of the choice (plain decoding's when it won)
    plain: float  # of plain decoding, same prompts, same run
    table: tuple[dict[str, Any], ...]  # every candidate: adapter, exit_layer, eta, f, tokens, accepted, ...
    directory: Path  # the cached artifact holding all of it

    @property
    def plain_wins(self) -> bool:
        return self.adapter is None

    def describe(self) -> str:
        """The table, one line per measurement, as a choice records it."""
        lines = [f"plain decoding: {self.plain:.4f} s/token"]
        for row in self.table:
            lines.append(f"exit layer {row['exit_layer']}, eta {row['eta']:g}: {row['f']:.4f} s/token "
                         f"({self.plain / row['f']:.2f}x plain; {row['accepted']:.0f} accepted of "
                         f"{row['tokens']:.0f} tokens), {row['adapter']}")
        lines.append(f"artifact: {self.directory}")
        return "\n".join(lines)


def candidate_adapters(config: KangarooConfig, checkpoint: str, roots: tuple[Path, ...] | None = None) -> list[Path]:
    """adapter=auto: every adapter found for the target; else the given or default adapter alone.
    Absolute paths, so that the key and the choice name the same files from any directory."""
    if isinstance(config.adapter, AutoAdapter):
        found = adapters_for(checkpoint, roots)
    else:
        found = [Path(config.adapter) if config.adapter else default_adapter(checkpoint)]
    return [path.resolve() for path in found]


def candidate_etas(config: KangarooConfig, settings: KangarooAutoSettings) -> tuple[float, ...]:
    return settings.etas if isinstance(config.eta, AutoEta) else (config.eta,)


def configuration_key(target: Backend, config: KangarooConfig, policy: SamplingPolicy, verifier: str,
                      adapters: Sequence[Path], etas: Sequence[float], prompts: Sequence[Sequence[int]],
                      settings: KangarooAutoSettings) -> dict[str, Any]:
    """Everything a measured time per token depends on, as JSON values (so that the copy read
    back from a manifest compares equal)."""
    key = {
        "target": target.info.checkpoint,
        "tokenizer_hash": target.info.tokenizer_hash,
        "backend": target.info.name,
        "dtype": target.info.dtype,
        "threads": getattr(target, "n_threads", None),
        "policy": policy.as_dict(),
        "verifier": verifier,
        "calibration_prompts": calibration_hash(prompts),
        # the adapter's manifest hash binds its weights: a retrained adapter at the same path is another candidate
        "adapters": [{"path": str(path), "manifest_hash": read_manifest(path, kind=ADAPTER_KIND).hash}
                     for path in adapters],
        "etas": [float(eta) for eta in etas],
        "drafter": {k: v for k, v in config_items(config).items() if k not in ("adapter", "eta")},
        "max_new_tokens": settings.max_new_tokens,
    }
    normalized: dict[str, Any] = json.loads(json.dumps(key))
    return normalized


def auto_kangaroo(target: Backend, config: KangarooConfig, policy: SamplingPolicy, verifier: str,
                  calibration_prompts: Sequence[Sequence[int]], cache_root: Path,
                  settings: KangarooAutoSettings = KangarooAutoSettings(),
                  measure: Measure = seconds_per_token) -> KangarooAutoChoice:
    """The (adapter, eta) with the least measured time per committed token, or plain decoding;
    from the cache when a valid artifact for this configuration is there, measured now else.
    `measure`: how one candidate is timed (a test passes known times)."""
    if not isinstance(target, TransformersBackend):
        raise BackendError(f"Kangaroo runs the target's shallow layers on the transformers backend, not "
                           f"{target.info.name}: eta=auto and adapter=auto measure it there")
    adapters = candidate_adapters(config, target.info.checkpoint, settings.adapter_roots)
    etas = candidate_etas(config, settings)
    key = configuration_key(target, config, policy, verifier, adapters, etas, calibration_prompts, settings)
    directory = Path(cache_root) / "kangaroo" / stable_hash(key)[:20]
    cached = read_choice(directory, key)
    if cached is not None:
        return cached
    log.info("kangaroo auto: measuring %d adapter(s) x %d eta(s) and plain decoding on %d calibration prompts",
             len(adapters), len(etas), len(calibration_prompts))
    tuned = tune_kangaroo(target, adapters, etas, calibration_prompts, settings.max_new_tokens, base=config,
                          policy=policy, verifier=verifier, measure=measure)
    plain_wins = tuned.plain < tuned.f  # ties go to the drafter: exact either way, and it was asked for
    data = {
        "plain": tuned.plain,
        "table": list(tuned.table),
        "choice": {"adapter": None if plain_wins else str(tuned.adapter), "eta": None if plain_wins else tuned.eta,
                   "f": tuned.plain if plain_wins else tuned.f},
    }
    shutil.rmtree(directory, ignore_errors=True)  # a tampered or foreign copy is replaced, never reused
    with staged_artifact(directory, KIND) as staging:
        (staging / DATA).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        write_manifest(staging, KIND, {"configuration": key, "objective": OBJECTIVE})
    return _choice_of(json.loads(json.dumps(data)), directory)  # as a later read of the artifact returns it


def read_choice(directory: Path, key: dict[str, Any]) -> KangarooAutoChoice | None:
    """The cached choice in `directory` if its manifest verifies and it was measured for `key`."""
    try:
        manifest = read_manifest(directory, kind=KIND, required=(DATA,))
        if manifest.provenance.get("configuration") != key:
            return None
        return _choice_of(json.loads((directory / DATA).read_text()), directory)
    except (ArtifactError, ValueError, KeyError, TypeError):
        return None  # missing, tampered, or not ours: measured again


def _choice_of(data: dict[str, Any], directory: Path) -> KangarooAutoChoice:
    chosen = data["choice"]
    adapter = None if chosen["adapter"] is None else Path(chosen["adapter"])
    eta = None if chosen["eta"] is None else float(chosen["eta"])
    return KangarooAutoChoice(adapter, eta, float(chosen["f"]), float(data["plain"]), tuple(data["table"]), directory)
