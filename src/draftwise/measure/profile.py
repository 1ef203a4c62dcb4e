"""Measure a backend's verification cost t(n): median seconds to verify n rows at once.

n counts rows including the pending token (n = 1 is a plain decoding step), the same n as
`optimize.hardware.VerifyCostProfile`.  Each n > 1 is verified as a RANDOM TREE of n - 1
candidate rows (fixed seed; each new row hangs under a uniformly chosen earlier row or the
frontier), because trees are what the optimizer builds from this profile and a tree costs
more than a chain of the same size on llama.cpp (leaf-sequence tagging, a multi-sequence
mask).  One sample = verify + rollback on a prefix of `prefix_len` committed tokens; a
rollback is what a fully rejected round costs in bookkeeping, and it restores the prefix so
every sample sees the same state.

The samples are taken in passes: one untimed warm-up pass over every n, then `repeats` timed
passes, each over every n in a fresh shuffled order.  Timing all repeats of one n back to back
let a slow spell of a shared machine land on that n alone (a larger n could then measure cheaper
than a smaller one); spread over passes it lands on one sample of each n, which the median drops.
Decoding changes its row count every round too, so a shuffled order is also the realistic one.

Noise.  Each profile records `noise_cv`, the median over its row counts of the repeats'
coefficient of variation (`draftwise.timing`), and `reliable` (noise_cv within
`timing.DEFAULT_MAX_CV`).  A profile measured while the machine was busy is used for the run
that measured it and never reused from the cache (`optimize.auto.sampled_as_now`).
"""

from __future__ import annotations

import logging

import os
import platform
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from draftwise.backends.base import Backend
from draftwise.backends.batch import BatchBackend, VerifyCall
from draftwise.errors import InputError
from draftwise.timing import DEFAULT_MAX_CV
from draftwise.runtime.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract
from draftwise.runtime.contracts import SamplingRelation, TopologyKind
from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.topology.compile import CompiledRound, TreeLimits, compile_round

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)
# how the samples were taken, in each profile's provenance: a cached profile sampled otherwise
# (all repeats of one n back to back, before 2026-12-01) is measured again, not reused
SAMPLING = "shuffled passes"
EXTEND_SHAPE = "extend of n tokens, last row's logits"  # a profile's `shape` when it timed extends
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


def _round_of_parents(prefix_len: int, parents: list[int], vocab_size: int,
                      tokens: Sequence[int] | None = None) -> CompiledRound:
    """Candidate row i under row parents[i] (-1 = the frontier), parents before children; row i
    carries tokens[i], or distinct made-up tokens (so the full-prefix merge keeps every row)."""
    nodes: list[ProposalNode] = []
    for i, parent in enumerate(parents):
        depth = 1 if parent == -1 else nodes[parent].depth + 1
        token = int(tokens[i]) if tokens is not None else (1000 + i) % vocab_size
        nodes.append(ProposalNode(token=token, parent=parent, depth=depth))
    result = ProposalResult(tuple(nodes), _CONTRACT, "profile", "profile")
    return compile_round(prefix_len, [result], TreeLimits(max_nodes=len(parents), max_depth=len(parents)))


def random_tree(prefix_len: int, n_nodes: int, vocab_size: int, rng: np.random.Generator) -> CompiledRound:
    """n_nodes rows, each under a uniformly chosen earlier row or the frontier."""
    return _round_of_parents(prefix_len, [int(rng.integers(-1, i)) for i in range(n_nodes)], vocab_size)


def chain_round(prefix_len: int, n_nodes: int, vocab_size: int, tokens: Sequence[int] | None = None) -> CompiledRound:
    """A chain of n_nodes candidate rows: what a sequence proposer (prompt lookup, a draft
    chain) verifies, and all a chain-only llama.cpp context (no tree sequences) can verify."""
    return _round_of_parents(prefix_len, list(range(-1, n_nodes - 1)), vocab_size, tokens)


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
    *,
    chain: bool = False,
    extend: bool = False,
) -> dict:
    """Median verify time per row count on a realistic prefix; the backend is reset first.
    `chain`: time chains of n - 1 candidates instead of random trees.  `extend`: time an
    extend of n tokens (the last row's logits only, then truncated back) instead of a verify:
    what a draft model's catch-up over the tokens published since its last round costs, which
    on a 150k-token vocabulary is well below a verify of as many rows (every row's logits)."""
    if chain and extend:
        raise InputError("time chains or extends, not both")
    text_ids = backend.tokenize(_PREFIX_TEXT, add_special=False)
    prefix = (text_ids * (prefix_len // len(text_ids) + 1))[:prefix_len]
    backend.reserve(0 if chain or extend else max(rows) - 1)  # a tree of n rows has n - 1 candidates
    backend.reset()
    backend.extend(prefix[:-1])
    pending = prefix[-1]
    rng = np.random.default_rng(0)
    rounds: dict[int, CompiledRound | None] = {}
    for n in rows:
        if n == 1 or extend:
            rounds[n] = None
        elif chain:
            rounds[n] = chain_round(backend.cached_len + 1, n - 1, backend.info.vocab_size)
        else:
            rounds[n] = random_tree(backend.cached_len + 1, n - 1, backend.info.vocab_size, rng)
    base = backend.cached_len
    order_rng = np.random.default_rng(1)
    samples: dict[int, list[float]] = {n: [] for n in rows}
    for sweep in range(repeats + 1):  # sweep 0 is the warm-up
        for n in (rows if sweep == 0 else [rows[i] for i in order_rng.permutation(len(rows))]):
            start = time.perf_counter()
            if extend:
                backend.extend([pending, *prefix[: n - 1]])
                backend.truncate(base)
            else:
                backend.verify(pending, rounds[n])
                backend.rollback()
            if sweep:
                samples[n].append(time.perf_counter() - start)
        if sweep:
            log.info("pass %d/%d over %d row counts", sweep, repeats, len(rows))
    medians = [float(np.median(samples[n])) for n in rows]
    for n, median in zip(rows, medians):
        log.info("n=%3d: %8.2f ms (x%.2f)", n, median * 1e3, median / medians[0])
    backend.reset()
    noise = noise_of(samples.values())
    return {
        **noise,
        "rows": [int(n) for n in rows],
        "absolute_s": medians,
        "relative": [m / medians[0] for m in medians],
        "model": backend.info.checkpoint,
        "backend": backend.info.name,
        "dtype": backend.info.dtype,
        "threads": int(getattr(backend, "n_threads", 0) or len(os.sched_getaffinity(0))),
        "machine": machine_description(),
    }


def noise_of(samples: Iterable[Sequence[float]]) -> dict[str, Any]:
    """{"noise_cv": the median over cells of their repeats' stdev / mean, "reliable": within the
    limit}; with single repeats the noise is unknown (both None: the caller asked for one pass)."""
    cvs = [float(np.std(s, ddof=1) / np.mean(s)) for s in samples if len(s) > 1 and np.mean(s) > 0]
    if not cvs:
        return {"noise_cv": None, "reliable": None}
    cv = float(np.median(cvs))
    if cv > DEFAULT_MAX_CV:
        log.warning("the machine was busy while this profile was measured (its repeats varied %.0f%%, limit %.0f%%): "
                    "it is used for this run and measured again next time", 100 * cv, 100 * DEFAULT_MAX_CV)
    return {"noise_cv": round(cv, 4), "reliable": cv <= DEFAULT_MAX_CV}


def write_profile(
    backend: Backend,
    out_dir: Path,
    prefix_len: int = 512,
    rows: Sequence[int] = DEFAULT_ROWS,
    repeats: int = 5,
    *,
    chain: bool = False,
    extend: bool = False,
) -> VerifyCostProfile:
    """Measure and save a verify_profile artifact in `out_dir`; progress is logged per n."""
    measured = profile_verify_cost(backend, prefix_len, rows, repeats, chain=chain, extend=extend)
    shape = (EXTEND_SHAPE if extend else "chain of n - 1 rows" if chain else "random tree of n - 1 rows, seed 0")
    profile = VerifyCostProfile.from_absolute(
        measured["rows"], measured["absolute_s"], model=measured["model"], backend=measured["backend"],
        threads=measured["threads"], machine=measured["machine"],
        provenance={"prefix_len": prefix_len, "repeats": repeats, "shape": shape, "sampling": SAMPLING,
                    "dtype": measured["dtype"], "noise_cv": measured["noise_cv"], "reliable": measured["reliable"]},
    )
    profile.save(Path(out_dir))
    return profile


def profile_batch_verify_cost(batch: BatchBackend, batch_sizes: Sequence[int], rows: Sequence[int],
                              prefix_len: int = 256, repeats: int = 3) -> BatchCostProfile:
    """t_B(n): for each B, the median time of one `verify_many` in which B slots (each on its own
    `prefix_len`-token prefix) verify a chain of n - 1 candidates each, relative to B pending-only
    rows; passes over (B, n) shuffled, a warm-up pass first.  Every slot is closed afterwards."""
    if min(rows) != 1:
        raise InputError("batch profiles are relative to a plain batched step: measure n = 1 too")
    if max(batch_sizes) > batch.max_slots:
        raise InputError(f"batch size {max(batch_sizes)} exceeds the backend's {batch.max_slots} slots")
    text_ids = batch.tokenize(_PREFIX_TEXT, add_special=False)
    prefix = (text_ids * (prefix_len // len(text_ids) + 1))[:prefix_len]
    slots = [batch.open() for _ in range(max(batch_sizes))]
    try:
        for slot in slots:  # read each prefix (its last token stays pending)
            batch.verify_many([VerifyCall(slot, prefix[-1], None, tuple(prefix[:-1]))])
            batch.rollback(slot)
        chains = {n: None if n == 1 else chain_round(prefix_len, n - 1, batch.info.vocab_size) for n in rows}
        cells = [(b, n) for b in batch_sizes for n in rows]
        samples: dict[tuple[int, int], list[float]] = {cell: [] for cell in cells}
        order_rng = np.random.default_rng(1)
        for sweep in range(repeats + 1):  # sweep 0 is the warm-up
            for b, n in (cells if sweep == 0 else [cells[i] for i in order_rng.permutation(len(cells))]):
                calls = [VerifyCall(slot, prefix[-1], chains[n]) for slot in slots[:b]]
                start = time.perf_counter()
                batch.verify_many(calls)
                elapsed = time.perf_counter() - start
                for slot in slots[:b]:
                    batch.rollback(slot)
                if sweep:
                    samples[(b, n)].append(elapsed)
            if sweep:
                log.info("batch profile: pass %d/%d over %d (B, n) cells", sweep, repeats, len(cells))
    finally:
        for slot in slots:
            batch.close(slot)
    threads = int(batch.n_threads or len(os.sched_getaffinity(0)))
    provenance = {"prefix_len": prefix_len, "repeats": repeats, "shape": "a chain of n - 1 rows per slot",
                  "sampling": SAMPLING, "dtype": batch.info.dtype, **noise_of(samples.values())}
    by_batch = {}
    for b in batch_sizes:
        medians = [float(np.median(samples[(b, n)])) for n in rows]
        log.info("B=%d: %s", b, ", ".join(f"t({n})={m / medians[0]:.2f}" for n, m in zip(rows, medians)))
        by_batch[int(b)] = VerifyCostProfile.from_absolute(rows, medians, model=batch.info.checkpoint,
                                                           backend=batch.info.name, threads=threads,
                                                           machine=machine_description(), provenance=provenance)
    return BatchCostProfile(by_batch)
