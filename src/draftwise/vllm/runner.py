"""Run vLLM from draftwise's environment: the worker (`draftwise.vllm.worker`) in .venv-vllm,
as a subprocess, with the settings issue 45 found vLLM's CPU build needs here.

vLLM is never imported in draftwise's own environment; what crosses is JSON
(`draftwise.vllm.protocol`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.errors import BackendError
from draftwise.vllm.protocol import BatchResult, ProfileRequest, WorkerRequest

REPO = Path(__file__).resolve().parents[3]  # src/draftwise/vllm -> the checkout (an editable install)
DEFAULT_VENV = REPO / ".venv-vllm"
SETUP_HINT = "run scripts/setup_vllm.sh (it builds .venv-vllm, ~3.5 GB; CI does not)"


@dataclass(frozen=True)
class VllmEnvironment:
    """How the worker runs.  `kv_space_gb`: VLLM_CPU_KVCACHE_SPACE (unset, vLLM reserves most of
    the memory and starts several times slower); `iomp`: preload the Intel OpenMP vLLM ships (its
    CPU speculation warns without it); `threads_bind`: VLLM_CPU_OMP_THREADS_BIND (vLLM's `auto`
    binds one core on a 2-core machine and reserves the other)."""

    venv: Path = DEFAULT_VENV
    kv_space_gb: int = 2
    iomp: bool = False
    threads_bind: str = "auto"
    timeout_s: float = 1800.0

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def compute_threads(self) -> int:
        """Cores vLLM computes on: `auto` binds all but one; else the cores the binding lists."""
        if self.threads_bind == "auto":
            return max(1, (os.cpu_count() or 2) - 1)
        cores = 0
        for span in self.threads_bind.split(","):
            first, _, last = span.partition("-")
            cores += int(last or first) - int(first) + 1
        return cores

    def missing(self) -> str | None:
        """Why vLLM cannot run here (None: it can)."""
        if not self.python.is_file():
            return f"no vLLM environment at {self.venv}: {SETUP_HINT}"
        return None

    def variables(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(self.kv_space_gb), "HF_HUB_OFFLINE": "1",
                    "VLLM_CPU_OMP_THREADS_BIND": self.threads_bind,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))})
        if self.iomp:
            libs = sorted((self.venv / "lib").glob("libiomp5.so"))
            if not libs:
                raise BackendError(f"no libiomp5.so under {self.venv / 'lib'}")
            env["LD_PRELOAD"] = os.pathsep.join(filter(None, [str(libs[0]), env.get("LD_PRELOAD")]))
        return env


def _run(body: dict[str, Any], environment: VllmEnvironment, log_path: Path | None) -> Any:
    """The worker on one request body; its JSON result (None when it wrote none)."""
    reason = environment.missing()
    if reason:
        raise BackendError(reason)
    with tempfile.TemporaryDirectory(prefix="draftwise-vllm-") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_path.write_text(json.dumps(body))
        command = [str(environment.python), "-m", "draftwise.vllm.worker", str(request_path), str(result_path)]
        with open(log_path or os.devnull, "w") as log:
            done = subprocess.run(command, env=environment.variables(), stdout=log, stderr=subprocess.STDOUT,
                                  timeout=environment.timeout_s, check=False)
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if done.returncode != 0:
        where = f"; its log: {log_path}" if log_path else ""
        raise BackendError(f"the vLLM worker exited with status {done.returncode}{where}")
    return result


@dataclass(frozen=True)
class WorkerOutcome:
    results: tuple[BatchResult, ...]
    errors: Mapping[str, str]  # method -> why vLLM refused it (the root cause is in vLLM's log)

    def by_method(self) -> dict[tuple[str, int], BatchResult]:
        return {(r.method, r.batch): r for r in self.results}


def run_worker(request: WorkerRequest, environment: VllmEnvironment = VllmEnvironment(),
               log_path: Path | None = None) -> WorkerOutcome:
    """Every method of `request` at every batch size, in one worker process (vLLM's log goes to
    `log_path`, or is dropped); a method vLLM refuses is reported, and the others still run."""
    body = _run(request.to_json(), environment, log_path) or {}
    return WorkerOutcome(tuple(BatchResult.from_json(r) for r in body.get("results", ())), dict(body.get("errors", {})))


def run_profile(request: ProfileRequest, environment: VllmEnvironment = VllmEnvironment(),
                log_path: Path | None = None) -> BatchCostProfile:
    """t_B(n) measured in vLLM's own kernels and scheduler (see ProfileRequest)."""
    from draftwise.measure.profile import machine_description

    body = _run(request.to_json(), environment, log_path)
    threads = environment.compute_threads
    provenance = {"engine": "vllm", "prefix_len": request.prefix_len, "short": request.short, "long": request.long,
                  "repeats": request.repeats, "dtype": request.dtype, "enforce_eager": request.enforce_eager,
                  "shape": "a fixed never-accepted chain of n - 1 rows per request (custom_class)"}
    return BatchCostProfile({int(b): VerifyCostProfile.from_absolute(
        body["rows"], seconds, model=request.model, backend="vllm", threads=threads,
        machine=machine_description(), provenance=provenance) for b, seconds in body["seconds"].items()})


def installed_version(environment: VllmEnvironment = VllmEnvironment()) -> tuple[int, ...] | None:
    """The vllm-cpu (or vllm) version installed in the environment, read from its package
    metadata without importing it; None without the environment."""
    for dist in sorted(environment.venv.glob("lib/python*/site-packages/vllm*.dist-info")):
        name, _, version = dist.name.removesuffix(".dist-info").partition("-")
        if name in ("vllm", "vllm_cpu"):
            return tuple(int(p) for p in version.split("+")[0].split(".")[:3] if p.isdigit())
    return None


def has_batch_schedule(environment: VllmEnvironment = VllmEnvironment()) -> bool | None:
    """Whether the installed vLLM takes `num_speculative_tokens_per_batch_size` (a K per batch-size
    range; 0.32.0 does), read from its source without importing it; None without the environment."""
    sources = sorted(environment.venv.glob("lib/python*/site-packages/vllm/config/speculative.py"))
    if not sources:
        return None
    return "num_speculative_tokens_per_batch_size" in sources[0].read_text()
