"""`dtype auto`: the faster of float32 and bfloat16 for the transformers backend on this machine.

Decided by measurement, never by a rule of thumb (what each dtype means for exactness:
`draftwise.backends.dtype`): without native bf16 arithmetic (avx512_bf16 or amx_bf16) the CPU
computes bf16 by converting to float32 and back, so auto is float32 without measuring; with it,
one-row decode steps of both copies of the loaded model are timed, interleaved, and the choice is
cached per checkpoint, thread count, machine and torch version (the kernels are torch's).
"""

from __future__ import annotations

import logging

import gc
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from draftwise.artifacts import read_manifest, stable_hash, staged_artifact, write_manifest
from draftwise.backends.dtype import CONCRETE_DTYPES, TorchDtype
from draftwise.errors import ArtifactError
from draftwise.measure import auto_cache_root

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs that compute in bf16
ARTIFACT_KIND = "dtype_choice"


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """The native-bf16 flags this CPU reports (empty where none, or no /proc/cpuinfo).
    torch's own `get_cpu_capability()` stops at "AVX512" and does not tell bf16 apart."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(flag for flag in NATIVE_BF16_FLAGS if flag in flags)


@dataclass(frozen=True)
class DtypeTiming:
    """How `auto` times the two dtypes: `passes` rounds, each `steps` one-row decode steps of
    float32 then bfloat16 (the order alternates by pass, so a slow spell of a shared machine
    lands on both), on a `prefix_len`-token prefix; one untimed step per dtype first."""

    prefix_len: int = 128
    steps: int = 3
    passes: int = 3
    margin: float = 0.05  # bfloat16 must be this much faster: within noise, keep the faithful float32


@dataclass(frozen=True)
class DtypeDecision:
    """What `auto` chose and why; `medians_s` is empty when nothing was timed."""

    chosen: TorchDtype
    reason: str
    medians_s: dict[str, float]
    directory: Path | None = None  # the cached artifact

    def describe(self) -> str:
        timed = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.medians_s.items())
        return f"dtype auto -> {self.chosen}: {self.reason}" + (f" (one-row step medians: {timed})" if timed else "")


NO_NATIVE_BF16 = DtypeDecision("float32", "this CPU reports no native bf16 (avx512_bf16, amx_bf16): bf16 would be "
                               "emulated through float32, so nothing is timed", {})


def recorded_decision(checkpoint: str, threads: int, device: str, cache_root: Path | None = None) -> DtypeDecision | None:
    """The decision `auto` made for this checkpoint here (what `choose_dtype` cached), for the record."""
    if not cpu_bf16_flags():
        return NO_NATIVE_BF16
    key = dtype_key(checkpoint, threads, device)
    return cached_decision(dtype_directory(auto_cache_root() if cache_root is None else cache_root, key), key)


def dtype_key(checkpoint: str, threads: int, device: str, timing: DtypeTiming = DtypeTiming()) -> dict:
    """What the choice depends on: the weights, the threads, the machine, torch's kernels and the timing."""
    import torch

    from draftwise.measure.profile import machine_description

    return {"checkpoint": checkpoint, "threads": int(threads), "device": device, "machine": machine_description(),
            "torch": torch.__version__, "timing": timing.__dict__}


def dtype_directory(cache_root: Path, key: dict) -> Path:
    return Path(cache_root) / "dtype" / stable_hash(key)[:20]


def cached_decision(directory: Path, key: dict) -> DtypeDecision | None:
    """The choice recorded in `directory` for exactly `key`; None if absent, corrupt or foreign."""
    try:
        provenance = read_manifest(directory, kind=ARTIFACT_KIND).provenance
    except ArtifactError:
        return None
    if provenance.get("key") != key or provenance.get("chosen") not in CONCRETE_DTYPES:
        return None
    return DtypeDecision(provenance["chosen"], f"{provenance.get('reason', '')}, cached", dict(provenance["medians_s"]),
                         directory)


def time_one_row_steps(backends: dict[str, object], timing: DtypeTiming = DtypeTiming()) -> dict[str, float]:
    """Median seconds of a one-row decode step (`extend` of one token on a committed prefix,
    the step plain decoding repeats) per backend, interleaved as `DtypeTiming` says."""
    import numpy as np

    text = "def fibonacci(n: int) -> int:\n    \"\"\"The n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    samples: dict[str, list[float]] = {name: [] for name in backends}
    bases: dict[str, tuple[int, list[int]]] = {}
    for name, backend in backends.items():
        ids = backend.tokenize(text, add_special=False)
        length = min(timing.prefix_len, backend.info.context_length - timing.steps - 1)  # room for the steps
        prefix = (ids * (length // max(len(ids), 1) + 1))[:length]
        backend.reset()
        backend.extend(prefix)
        bases[name] = (backend.cached_len, prefix[: timing.steps + 1])
        backend.extend(prefix[:1])  # warm-up step, untimed
        backend.truncate(bases[name][0])
    names = list(backends)
    for sweep in range(timing.passes):
        for name in names if sweep % 2 == 0 else names[::-1]:
            backend, (base, tokens) = backends[name], bases[name]
            for token in tokens[: timing.steps]:
                start = time.perf_counter()
                backend.extend([token])
                samples[name].append(time.perf_counter() - start)
            backend.truncate(base)
    for backend in backends.values():
        backend.reset()
    return {name: float(np.median(values)) for name, values in samples.items()}


def decide(medians: dict[str, float], timing: DtypeTiming = DtypeTiming()) -> tuple[TorchDtype, str]:
    fp32, bf16 = medians["float32"], medians["bfloat16"]
    if bf16 < fp32 * (1 - timing.margin):
        return "bfloat16", f"bfloat16 one-row steps {fp32 / bf16:.2f}x faster than float32"
    return "float32", f"bfloat16 not {timing.margin:.0%} faster than float32 (ratio {fp32 / bf16:.2f}x)"


def choose_dtype(load: Callable[[str], object], checkpoint: str, threads: int, device: str, cache_root: Path | None = None,
                 timing: DtypeTiming = DtypeTiming(),
                 cpu_flags: tuple[str, ...] | None = None) -> tuple[object, DtypeDecision]:
    """The backend `auto` settles on and the decision.  `load(dtype)` loads the model in a
    concrete dtype.  Both copies are held while timing (float32 + bfloat16: the float32
    model's memory and half as much again), then the slower one is dropped; a cached decision loads one copy only."""
    flags = cpu_bf16_flags() if cpu_flags is None else cpu_flags
    if not flags:
        return load("float32"), NO_NATIVE_BF16
    cache_root = auto_cache_root() if cache_root is None else cache_root
    key = dtype_key(checkpoint, threads, device, timing)
    directory = dtype_directory(cache_root, key)
    decision = cached_decision(directory, key)
    if decision is not None:
        return load(decision.chosen), decision
    log.info("dtype auto: timing one-row decode steps of %s in float32 and bfloat16 (once; cached in %s)",
             checkpoint, directory)
    backends = {"float32": load("float32"), "bfloat16": load("bfloat16")}
    medians = time_one_row_steps(backends, timing)
    chosen, reason = decide(medians, timing)
    reason = f"{reason} (CPU flags {', '.join(flags)})"
    if directory.exists() and cached_decision(directory, key) is None:
        shutil.rmtree(directory)  # corrupt or foreign: measured again, never reused
    with staged_artifact(directory, ARTIFACT_KIND) as staging:
        write_manifest(staging, ARTIFACT_KIND, {"key": key, "chosen": chosen, "reason": reason, "medians_s": medians,
                                                "cpu_flags": list(flags)})
    decision = DtypeDecision(chosen, reason, medians, directory)
    kept = backends.pop(chosen)
    backends.clear()
    gc.collect()  # the other copy's weights go back before decoding starts
    log.info(decision.describe())
    return kept, decision
