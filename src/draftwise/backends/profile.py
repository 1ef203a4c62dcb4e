"""Measure a backend's verification cost t(n): median seconds to verify n rows at once.

n counts rows including the pending token (n = 1 is a plain decoding step), the same n as
`optimize.hardware.VerifyCostProfile`.  Each n > 1 is verified as a RANDOM TREE of n - 1
candidate rows (fixed seed; each new row hangs under a uniformly chosen earlier row or the
frontier), because trees are what the optimizer builds from this profile and a tree costs
more than a chain of the same size on llama.cpp (leaf-sequence tagging, a multi-sequence
mask).  One sample = verify + rollback on a prefix of `prefix_len` committed tokens; a
rollback is what a fully rejected round costs in bookkeeping, and it restores the prefix so
every sample sees the same state.  One untimed warm-up sample per n precedes the timed ones.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from draftwise.backends.base import Backend
from draftwise.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract
from draftwise.contracts import SamplingRelation, TopologyKind
from draftwise.optimize.hardware import VerifyCostProfile
from draftwise.topology.compile import CompiledRound, TreeLimits, compile_round

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)
_CONTRACT = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)
# realistic text for the prefix (attention cost grows with it; the content does not matter)
_PREFIX_TEXT = (
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
    "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
    "    out, i, j = [], 0, 0\n"
    "    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
    "        else:\n            out.append(b[j]); j += 1\n"
    "    return out + a[i:] + b[j:]\n\n"
)


def _round_of_parents(prefix_len: int, parents: list[int], vocab_size: int) -> CompiledRound:
    """Candidate row i under row parents[i] (-1 = the frontier), parents before children."""
    nodes: list[ProposalNode] = []
    for i, parent in enumerate(parents):
        depth = 1 if parent == -1 else nodes[parent].depth + 1
        # distinct tokens, so the full-prefix merge keeps every row
        nodes.append(ProposalNode(token=(1000 + i) % vocab_size, parent=parent, depth=depth))
    result = ProposalResult(tuple(nodes), _CONTRACT, "profile", "profile")
    return compile_round(prefix_len, [result], TreeLimits(max_nodes=len(parents), max_depth=len(parents)))


def random_tree(prefix_len: int, n_nodes: int, vocab_size: int, rng: np.random.Generator) -> CompiledRound:
    """n_nodes rows, each under a uniformly chosen earlier row or the frontier."""
    return _round_of_parents(prefix_len, [int(rng.integers(-1, i)) for i in range(n_nodes)], vocab_size)


def chain_round(prefix_len: int, n_nodes: int, vocab_size: int) -> CompiledRound:
    """A chain of n_nodes candidate rows: what a sequence proposer (prompt lookup, a draft
    chain) verifies, and all a chain-only llama.cpp context (no tree sequences) can verify."""
    return _round_of_parents(prefix_len, list(range(-1, n_nodes - 1)), vocab_size)


def machine_description() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def profile_verify_cost(
    backend: Backend,
    prefix_len: int = 512,
    rows: Sequence[int] = DEFAULT_ROWS,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
    chain: bool = False,
) -> dict:
    """Median verify time per row count on a realistic prefix; the backend is reset first.
    `chain`: time chains of n - 1 candidates instead of random trees."""
    say = progress or (lambda message: None)
    text_ids = backend.tokenize(_PREFIX_TEXT, add_special=False)
    prefix = (text_ids * (prefix_len // len(text_ids) + 1))[:prefix_len]
    backend.reset()
    backend.extend(prefix[:-1])
    pending = prefix[-1]
    rng = np.random.default_rng(0)
    medians: list[float] = []
    for n in rows:
        if n == 1:
            round_ = None
        elif chain:
            round_ = chain_round(backend.cached_len + 1, n - 1, backend.info.vocab_size)
        else:
            round_ = random_tree(backend.cached_len + 1, n - 1, backend.info.vocab_size, rng)
        samples = []
        for i in range(repeats + 1):
            start = time.perf_counter()
            backend.verify(pending, round_)
            backend.rollback()
            if i:  # the first is the warm-up
                samples.append(time.perf_counter() - start)
        medians.append(float(np.median(samples)))
        say(f"n={n:3d}: {medians[-1] * 1e3:8.2f} ms (x{medians[-1] / medians[0]:.2f})")
    backend.reset()
    return {
        "rows": [int(n) for n in rows],
        "absolute_s": medians,
        "relative": [m / medians[0] for m in medians],
        "model": backend.info.checkpoint,
        "backend": backend.info.name,
        "threads": int(getattr(backend, "n_threads", 0) or len(os.sched_getaffinity(0))),
        "machine": machine_description(),
    }


def write_profile(
    backend: Backend,
    out_dir: Path,
    prefix_len: int = 512,
    rows: Sequence[int] = DEFAULT_ROWS,
    repeats: int = 5,
    progress: Callable[[str], None] | None = print,
    chain: bool = False,
) -> VerifyCostProfile:
    """Measure and save a verify_profile artifact in `out_dir`; progress is printed per n."""
    measured = profile_verify_cost(backend, prefix_len, rows, repeats, progress, chain)
    shape = "chain of n - 1 rows" if chain else "random tree of n - 1 rows, seed 0"
    profile = VerifyCostProfile.from_absolute(
        measured["rows"], measured["absolute_s"], model=measured["model"], backend=measured["backend"],
        threads=measured["threads"], machine=measured["machine"],
        provenance={"prefix_len": prefix_len, "repeats": repeats, "shape": shape},
    )
    profile.save(Path(out_dir))
    return profile
