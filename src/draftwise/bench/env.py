"""The environment a result was measured in: machine, threads, library versions, model hashes."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform

from draftwise.measure.dtype import cpu_bf16_flags
from draftwise.models import ModelError, resolve

LIBRARIES = ("draftwise", "torch", "transformers", "llama_cpp_python", "numpy", "tokenizers")


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def model_hashes(names: set[str]) -> dict[str, str | None]:
    """sha256 of each model file (pinned for aliases, so nothing is re-read or downloaded)."""
    hashes: dict[str, str | None] = {}
    for name in sorted(names):
        try:
            hashes[name] = resolve(name, pull=False).sha256
        except ModelError:
            hashes[name] = None
    return hashes


def machine() -> dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu_model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), None)
    except OSError:
        pass
    return {
        "node": platform.node(),
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "native_bf16": list(cpu_bf16_flags()),  # what `--dtype auto` reads before it times anything
        "python": platform.python_version(),
    }


def environment(threads: int, models: set[str]) -> dict:
    return {"machine": machine(), "threads": threads, "libraries": library_versions(), "models": model_hashes(models)}


def current_rss_bytes() -> int:
    """The process's resident memory now (Linux: /proc/self/statm, no psutil needed); elsewhere
    the peak so far (getrusage), which only grows.  Sampled per round by the concurrency cells,
    whose own peak the process-wide maximum would hide behind earlier, larger runs."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux and BSD report KiB
