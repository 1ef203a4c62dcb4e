"""What tracking hidden states (draft heads) costs a llama.cpp verify.

Two backends on the embedded SmolLM2-135M GGUF, loaded alike (`draftwise.measure.load.load_backend`),
one of them tracking hidden states (`track_hidden`: embeddings on for every verify decode, the
final-norm rows copied beside the logits).  Both hold the same ~256-token prefix; each verify
is a chain round of N candidate rows after the pending token (1 + N rows), rolled back after
it is timed, so the prefix never changes.  The two backends and every N are interleaved round
by round, so drift on a shared machine falls on both alike.  Also timed: a tracked `extend` of
the prefix against an untracked one (the tracked one decodes its last token alone).

    PYTHONPATH=src .venv/bin/python benchmarks/llamacpp_hidden/measure.py [--repeats 30] [--threads N] [--out DIR]

Writes results.json into --out (default: benchmarks/llamacpp_hidden/runs/<machine>-<date>/);
README.md beside this script reads the committed run.
"""

from __future__ import annotations

import subprocess
import argparse
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from draftwise.measure.load import load_backend
from draftwise.runtime.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract
from draftwise.runtime.contracts import SamplingRelation, TopologyKind
from draftwise.data import spec_bench_questions
from draftwise.topology.compile import TreeLimits, compile_round

PREFIX = 256
CANDIDATES = (0, 1, 4, 8, 16)  # candidate rows after the pending token (0: a plain decoding step)
CONTRACT = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.SEQUENCE)


def prefix_tokens(backend) -> list[int]:
    """~PREFIX tokens of chat text: Spec-Bench first turns, concatenated into one user message."""
    rows = [json.loads(line) for line in spec_bench_questions().read_text().splitlines() if line.strip()]
    text = ""
    while len(backend.tokenize(text)) < PREFIX + 8:
        text += rows[len(text) % len(rows)]["turns"][0] + "\n"
    return backend.chat_prompt([{"role": "user", "content": text}])[:PREFIX]


def chain(prefix_len: int, n: int, rng: np.random.Generator):
    if n == 0:
        return None
    nodes = tuple(ProposalNode(token=int(t), parent=i - 1, depth=i + 1) for i, t in enumerate(rng.integers(100, 40000, n)))
    return compile_round(prefix_len, [ProposalResult(nodes, CONTRACT, "bench", "h")], TreeLimits(max_nodes=64, max_depth=64))


def time_verify(backend, pending: int, round_) -> float:
    start = time.perf_counter()
    backend.verify(pending, round_)
    seconds = time.perf_counter() - start
    backend.rollback()
    return seconds


def time_extend(backend, tokens: list[int]) -> float:
    backend.reset()
    start = time.perf_counter()
    backend.extend(tokens)
    return time.perf_counter() - start


def default_run_dir(variant: str = "") -> Path:
    """benchmarks/<this study>/runs/<machine>-<date>[-VARIANT], named by benchmarks/peers/run_dir.sh."""
    here = Path(__file__).resolve().parent
    name = subprocess.run(["bash", str(here.parent / "peers" / "run_dir.sh"), here.name, *([variant] if variant else [])],
                          capture_output=True, text=True, check=True).stdout.strip()
    return here.parents[1] / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed verifies per (backend, N)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: every core)")
    parser.add_argument("--out", type=Path, help="run directory (default: benchmarks/llamacpp_hidden/runs/<machine>-<date>)")
    args = parser.parse_args()
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)

    backends = {"off": load_backend("smollm2-135m", "llamacpp", threads=args.threads),
                "on": load_backend("smollm2-135m", "llamacpp", threads=args.threads)}
    backends["on"].track_hidden()  # type: ignore[attr-defined]
    tokens = prefix_tokens(backends["off"])
    prompt, pending = tokens[:-1], tokens[-1]
    rng = np.random.default_rng(0)
    rounds = {n: chain(len(prompt) + 1, n, rng) for n in CANDIDATES}

    extend: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(max(3, args.repeats // 6)):
        for mode, backend in backends.items():
            extend[mode].append(time_extend(backend, prompt))
    for backend in backends.values():
        backend.reset()
        backend.extend(prompt)
        for n in CANDIDATES:
            for _ in range(args.warmup):
                time_verify(backend, pending, rounds[n])
    verify: dict[str, dict[int, list[float]]] = {mode: {n: [] for n in CANDIDATES} for mode in backends}
    for _ in range(args.repeats):
        for n in CANDIDATES:
            for mode, backend in backends.items():
                verify[mode][n].append(time_verify(backend, pending, rounds[n]))
    assert backends["on"].frontier_hidden() is not None  # type: ignore[attr-defined]  # kept across rollbacks

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def iqr(values: list[float]) -> list[float]:
        q = statistics.quantiles(values, n=4)
        return [q[0], q[2]]

    rows = []
    for n in CANDIDATES:
        off, on = med(verify["off"][n]), med(verify["on"][n])
        rows.append({"candidates": n, "rows": 1 + n, "off_ms": 1e3 * off, "on_ms": 1e3 * on, "ratio": on / off,
                     "off_iqr_ms": [1e3 * x for x in iqr(verify["off"][n])],
                     "on_iqr_ms": [1e3 * x for x in iqr(verify["on"][n])]})
    results = {
        "model": backends["off"].info.checkpoint, "prefix_tokens": len(prompt), "threads": backends["off"].n_threads,
        "repeats": args.repeats, "warmup": args.warmup, "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
        "load_avg_at_end": list(os.getloadavg()), "verify": rows,
        "extend_prefix": {"off_ms": 1e3 * med(extend["off"]), "on_ms": 1e3 * med(extend["on"]),
                          "ratio": med(extend["on"]) / med(extend["off"]), "repeats": len(extend["off"])},
        "samples_ms": {mode: {str(n): [1e3 * x for x in v] for n, v in per.items()} for mode, per in verify.items()},
    }
    out = args.out or default_run_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "samples_ms"}, indent=1))


if __name__ == "__main__":
    main()
