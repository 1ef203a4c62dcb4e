"""Batch-invariance probe: are a backend's verify rows the rows plain decoding would compute?

Greedy speculation is token-identical to plain decoding only if every row a verify batch
returns equals, bit for bit, the row plain decoding computes for the same tokens (one row per
step).  Kernels need not give that: llama.cpp's CPU kernels pick their summation order by the
batch's row count (`backends.llamacpp.LlamaCppKernels` says which).  The probe measures it for
the loaded backend exactly as it runs (its kernels, threads, context settings):

- for each prefix length P, the reference is plain decoding through the backend's own API
  (`verify(token, None)` + `commit(())` per token, as the engine's plain decoding does);
- for each size n (rows including the pending token), a chain of n - 1 candidates and a random
  tree of n - 1 candidates are verified in one batch on the same prefix, and each row is
  compared with the reference row of the same path: the largest absolute logit difference.

A tree's reference decodes each node's path once (depth-first, truncating back), so a tree of
n rows costs n plain steps.  The result (`InvarianceProbe`) says, per (prefix, shape, size),
whether the rows were bit-identical and by how much they differed; `exact_rows` is the largest
n up to which every probed size was bit-identical (1 when even two rows differ).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from draftwise.artifacts import read_manifest, staged_artifact, write_manifest
from draftwise.backends.base import Backend, StrictScope
from draftwise.backends.batch import BatchBackend, VerifyCall
from draftwise.measure.profile import _PREFIX_TEXT, chain_round, machine_description, random_tree
from draftwise.errors import InputError
from draftwise.topology.compile import CompiledRound

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

ARTIFACT_KIND = "invariance_probe"
DATA_FILE = "invariance.json"
DEFAULT_PREFIXES = (40, 256, 700)
DEFAULT_SIZES = tuple(range(2, 17))  # the rows of chains and trees the rounds use (gated rounds stay small)
SHAPES = ("chain", "tree")
STRICT_SCOPES: tuple[StrictScope, ...] = ("chains", "trees")
# a greedy divergence is explained by kernel rounding when plain decoding's top-2 margin at the
# parting token is within what two rows can move apart: each logit by up to the probe's bound
NEAR_TIE_FACTOR = 2.0


@dataclass(frozen=True)
class InvarianceCase:
    prefix_len: int
    shape: str  # "chain" or "tree"
    rows: int  # 1 + candidates
    max_abs_diff: float  # over every row and vocabulary entry; 0.0 = bit-identical


@dataclass(frozen=True)
class InvarianceProbe:
    model: str
    backend: str
    kernels: str  # the backend's kernel settings in words (llama.cpp) or its dtype
    threads: int
    machine: str
    cases: tuple[InvarianceCase, ...]

    @property
    def bit_identical(self) -> bool:
        return all(c.max_abs_diff == 0.0 for c in self.cases)

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.cases), default=0.0)

    @property
    def exact_rows(self) -> int:
        """The largest probed n such that every probed size up to n was bit-identical in every
        case (1: not even the smallest was).  Sizes between probed ones are assumed to behave
        like their neighbours: the kernels switch at row counts the probe's sizes bracket."""
        exact = 1
        for n in sorted({c.rows for c in self.cases}):
            if any(c.max_abs_diff != 0.0 for c in self.cases if c.rows == n):
                break
            exact = n
        return exact

    def near_tie_bound(self) -> float:
        """Top-2 margin below which plain decoding's greedy pick can flip under these kernels."""
        return NEAR_TIE_FACTOR * self.max_abs_diff

    def statement(self) -> str:
        """What `identical_to_ar` can be expected to be, in one sentence."""
        sizes = sorted({c.rows for c in self.cases})
        prefixes = sorted({c.prefix_len for c in self.cases})
        shapes = " and ".join(f"{shape}s" for shape in SHAPES if any(c.shape == shape for c in self.cases))
        scope = (f"{shapes} of {sizes[0]}-{sizes[-1]} rows after {prefixes[0]}-{prefixes[-1]} "
                 f"committed tokens" if sizes else "nothing probed")
        if self.bit_identical:
            return f"bit-identical rows (probe: {scope}): speculative output equals plain decoding by construction"
        return (f"exact up to kernel rounding: verify rows differ from plain decoding's by at most "
                f"{self.max_abs_diff:.3g} logits (probe: {scope}; bit-identical up to {self.exact_rows} rows), "
                f"so greedy output can part at a near-tie (top-2 margin < {self.near_tie_bound():.3g})")

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "backend": self.backend, "kernels": self.kernels, "threads": self.threads,
                "machine": self.machine, "bit_identical": self.bit_identical, "max_abs_diff": self.max_abs_diff,
                "exact_rows": self.exact_rows,
                "cases": [{"prefix_len": c.prefix_len, "shape": c.shape, "rows": c.rows,
                           "max_abs_diff": c.max_abs_diff} for c in self.cases]}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> "InvarianceProbe":
        try:
            cases = tuple(InvarianceCase(int(c["prefix_len"]), str(c["shape"]), int(c["rows"]),
                                         float(c["max_abs_diff"])) for c in body["cases"])
            return cls(str(body["model"]), str(body["backend"]), str(body["kernels"]), int(body["threads"]),
                       str(body["machine"]), cases)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed invariance probe: {exc}") from exc

    def save(self, directory: Path) -> None:
        with staged_artifact(Path(directory), ARTIFACT_KIND) as staging:
            (staging / DATA_FILE).write_text(json.dumps(self.to_json(), indent=1) + "\n")
            write_manifest(staging, ARTIFACT_KIND, {"model": self.model, "backend": self.backend,
                                                    "kernels": self.kernels, "threads": self.threads,
                                                    "machine": self.machine})

    @classmethod
    def load(cls, directory: Path) -> "InvarianceProbe":
        read_manifest(Path(directory), kind=ARTIFACT_KIND, required=(DATA_FILE,))
        return cls.from_json(json.loads((Path(directory) / DATA_FILE).read_text()))


def kernels_of(backend: Backend) -> str:
    kernels = getattr(backend, "kernels", None)
    return kernels.describe() if kernels is not None else f"dtype {backend.info.dtype}"


def probe_invariance(backend: Backend, prefixes: Sequence[int] = DEFAULT_PREFIXES,
                     sizes: Sequence[int] = DEFAULT_SIZES, seed: int = 0,
                     shapes: Sequence[str] = SHAPES) -> InvarianceProbe:
    """Measure every (prefix, shape, size) case; the backend is reset before and after."""
    if not prefixes or not sizes or min(sizes) < 2 or min(prefixes) < 2:
        raise InputError("the probe needs prefix lengths >= 2 and sizes >= 2 rows (a plain step is the reference)")
    if not shapes or set(shapes) - set(SHAPES):
        raise InputError(f"the probe measures shapes {SHAPES}, not {tuple(shapes)}")
    sizes = sorted(set(int(n) for n in sizes))
    if sizes[-1] > backend.info.max_verify_rows:
        sizes = [n for n in sizes if n <= backend.info.max_verify_rows]
    text_ids = backend.tokenize(_PREFIX_TEXT, add_special=False)
    need = max(prefixes) + max(sizes) + 1
    tokens = (text_ids * (need // len(text_ids) + 1))[:need]
    backend.reserve(max(sizes) - 1)
    rng = np.random.default_rng(seed)
    cases: list[InvarianceCase] = []
    for prefix_len in sorted(set(prefixes)):
        backend.reset()
        backend.extend(tokens[: prefix_len - 1])
        base = backend.cached_len
        pending = tokens[prefix_len - 1]
        # chains: the candidates are the text's next tokens (realistic rows), one reference pass
        if "chain" in shapes:
            chain_ref = _plain_rows(backend, [pending, *tokens[prefix_len : prefix_len + sizes[-1] - 1]])
            backend.truncate(base)
        for n in sizes:
            if "chain" in shapes:
                rows = _verify_rows(backend, pending, chain_round(base + 1, n - 1, backend.info.vocab_size,
                                                                  tokens[prefix_len : prefix_len + n - 1]))
                cases.append(InvarianceCase(prefix_len, "chain", n, _diff(rows, chain_ref[:n])))
            tree = random_tree(base + 1, n - 1, backend.info.vocab_size, rng)  # drawn either way: the same trees
            if "tree" in shapes:
                reference = _tree_reference(backend, pending, tree)
                backend.truncate(base)
                rows = _verify_rows(backend, pending, tree)
                cases.append(InvarianceCase(prefix_len, "tree", n, _diff(rows, reference)))
        worst = max(c.max_abs_diff for c in cases if c.prefix_len == prefix_len)
        log.info("prefix %d: %d sizes, largest row difference %.3g", prefix_len, len(sizes), worst)
    backend.reset()
    return InvarianceProbe(model=backend.info.checkpoint, backend=backend.info.name, kernels=kernels_of(backend),
                           threads=int(backend.n_threads), machine=machine_description(), cases=tuple(cases))


def _plain_rows(backend: Backend, tokens: Sequence[int]) -> np.ndarray:
    """[len(tokens), V] logits of plain decoding: one verify of the pending token per step."""
    rows = []
    for token in tokens:
        rows.append(np.array(backend.verify(int(token), None).logits[0], dtype=np.float32))
        backend.commit(())
    return np.stack(rows)


def _verify_rows(backend: Backend, pending: int, round_: CompiledRound) -> np.ndarray:
    logits = np.array(backend.verify(int(pending), round_).logits, dtype=np.float32)  # [1+N, V]
    backend.rollback()
    return logits


def _tree_reference(backend: Backend, pending: int, tree: CompiledRound) -> np.ndarray:
    """[1+N, V]: row 0 = the pending token's plain logits, row 1 + i = node i's after its path."""
    base = backend.cached_len
    out = np.zeros((1 + tree.n, backend.info.vocab_size), dtype=np.float32)
    out[0] = _plain_rows(backend, [pending])[0]
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parent.tolist()):
        children.setdefault(int(parent), []).append(i)

    def visit(node: int) -> None:
        length = backend.cached_len
        for child in children.get(node, []):
            out[1 + child] = _plain_rows(backend, [int(tree.token_ids[child])])[0]
            visit(child)
            backend.truncate(length)

    visit(-1)
    backend.truncate(base)
    return out


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def probe_cache_root() -> Path:
    from draftwise.models import cache_dir

    return cache_dir().parent / "invariance"


def cached_probe(backend: Backend, root: Path | None = None, shapes: Sequence[str] = SHAPES) -> InvarianceProbe:
    """The probe of this backend as loaded (model, kernels, threads, machine) over `shapes`:
    measured on first use (progress at INFO) and kept as an `invariance_probe` artifact; a
    cached one that no longer reads (tampered, another format) is measured again."""
    import hashlib

    shapes = tuple(shapes)
    parts = [backend.info.checkpoint, backend.info.name, kernels_of(backend), str(backend.n_threads),
             machine_description(), repr((DEFAULT_PREFIXES, DEFAULT_SIZES))]
    if shapes != SHAPES:  # the key of a full probe is unchanged, so its cached artifacts stay valid
        parts.append(repr(shapes))
    directory = (root or probe_cache_root()) / hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    if directory.exists():
        try:
            return InvarianceProbe.load(directory)
        except Exception as exc:  # noqa: BLE001 - any unreadable cache entry is re-measured, and said
            log.warning("re-measuring the invariance probe: the cached one at %s does not read (%s)", directory, exc)
            import shutil

            shutil.rmtree(directory)
    log.info("probing %s (%s): are verify rows bit-identical to plain decoding's? (once, cached)",
             backend.info.checkpoint, kernels_of(backend))
    probe = probe_invariance(backend, shapes=shapes)
    probe.save(directory)
    return probe


def load_strict(model, threads: int | None = None, root: Path | None = None,
                scope: StrictScope = "trees") -> Backend:
    """The llama.cpp backend with strict kernels for `scope`, its verify rows capped at the size
    its probe measured bit-identical; refused, with the probe's finding, when not even two rows
    are.  For chains, kernels with repacked weights are probed first (faster), then unpacked
    ones if the first were not exact at every probed size; the one exact up to more rows wins."""
    import dataclasses

    from draftwise.backends.base import BackendError
    from draftwise.backends.llamacpp import STRICT_CHAIN_KERNELS, STRICT_TREE_KERNELS, LlamaCppBackend

    if scope not in STRICT_SCOPES:
        raise InputError(f"strict scope {scope!r}: choose one of {', '.join(STRICT_SCOPES)}")
    if scope == "trees":
        candidates, shapes = [STRICT_TREE_KERNELS], SHAPES
    else:
        candidates, shapes = [STRICT_CHAIN_KERNELS, dataclasses.replace(STRICT_CHAIN_KERNELS, repack=False)], ("chain",)
    best: tuple[Backend, InvarianceProbe] | None = None
    for kernels in candidates:
        backend = LlamaCppBackend.load(model, n_threads=threads, kernels=kernels)
        probe = cached_probe(backend, root, shapes)
        if best is None or probe.exact_rows > best[1].exact_rows:
            if best is not None:
                best[0].close()
            best = (backend, probe)
        else:
            backend.close()
        if probe.exact_rows == max(DEFAULT_SIZES):
            break
    assert best is not None
    backend, probe = best
    if probe.exact_rows < 2:
        backend.close()
        worst = max((c for c in probe.cases), key=lambda c: c.max_abs_diff)
        raise BackendError(
            f"strict: no bit-exact verification of {scope} for {model.checkpoint_id} on this machine with "
            f"{probe.kernels}: a {worst.rows}-row {worst.shape} after {worst.prefix_len} tokens "
            f"differs from plain decoding by {worst.max_abs_diff:.3g} in a logit (even 2 rows differ)")
    backend.cap_verify_rows(probe.exact_rows)
    return backend


@dataclass(frozen=True)
class Divergence:
    """Where a greedy output first parts from plain decoding's, and whether kernel rounding explains it."""

    token_index: int  # first generated position where the two outputs differ
    plain_margin: float  # plain decoding's top-2 logit margin there
    bound: float  # the probe's near-tie bound
    near_tie: bool

    def describe(self) -> str:
        if self.near_tie:
            return (f"parted at generated token {self.token_index}, where plain decoding's top-2 margin was "
                    f"{self.plain_margin:.3g} < {self.bound:.3g}: a near-tie within the probe's kernel-rounding bound")
        return (f"parted at generated token {self.token_index}, where plain decoding's top-2 margin was "
                f"{self.plain_margin:.3g} >= {self.bound:.3g}: NOT explained by kernel rounding (a bug: please report it)")


def plain_margin(backend: Backend, tokens: Sequence[int]) -> float:
    """Plain decoding's top-2 logit margin for the token after `tokens` (the backend is reset)."""
    backend.reset()
    if len(tokens) > 1:
        backend.extend(list(tokens[:-1]))
    logits = np.array(backend.verify(int(tokens[-1]), None).logits[0], dtype=np.float64)
    backend.rollback()
    backend.reset()
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def find_divergence(backend: Backend, prompt: Sequence[int], got: Sequence[int], plain: Sequence[int],
                    probe: InvarianceProbe) -> Divergence | None:
    """None when `got` equals plain decoding's `plain`; else where it parts and whether at a near-tie."""
    if list(got) == list(plain):
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, plain)) if a != b), min(len(got), len(plain)))
    margin = plain_margin(backend, list(prompt) + list(plain[:first]))
    bound = probe.near_tie_bound()
    return Divergence(first, margin, bound, margin < bound)


# ---- batches: each slot's rows in a shared forward, against the same call alone ----------------
@dataclass(frozen=True)
class BatchInvarianceCase:
    slots: int  # B: calls in the shared forward
    candidates: int  # chain candidates per call (0 = pending-only)
    vs_alone: float  # max |dlogit| between a slot's rows in the shared forward and the same call alone (B = 1)
    vs_single: float  # ... and the same rows on a single-sequence backend (its verify)


def probe_batch_invariance(batch: BatchBackend, single: Backend, slot_counts: Sequence[int] = (1, 2, 4, 8),
                           candidates: Sequence[int] = (0, 3), prefix_len: int = 24,
                           seed: int = 0) -> list[BatchInvarianceCase]:
    """For B slots, each with its own prefix (lengths prefix_len + 7 * i, random text), verify
    every slot's pending token (and a chain of `candidates` rows) in one `verify_many`, and
    compare each slot's rows with the same call verified alone on the batch and with the same
    verify on `single` (same weights).  Slots opened here are closed again; needs B free slots."""
    rng = np.random.default_rng(seed)
    out = []
    vocab = batch.info.vocab_size
    for b in slot_counts:
        for n in candidates:
            prefixes = [[int(x) for x in rng.integers(100, 20000, prefix_len + 7 * i + 1 + n)] for i in range(b)]
            slots = [batch.open() for _ in range(b)]
            try:
                rounds = []
                for slot, tokens in zip(slots, prefixes):
                    batch.verify_many([VerifyCall(slot, tokens[-2 - n], None, tuple(tokens[: -2 - n]))])
                    batch.commit(slot, ())
                    p = batch.cached_len(slot)
                    rounds.append(chain_round(p + 1, n, vocab, tokens[-n:]) if n else None)
                calls = [VerifyCall(s, tokens[-1 - n], r) for s, tokens, r in zip(slots, prefixes, rounds)]
                shared = [np.array(x.logits, dtype=np.float64) for x in batch.verify_many(calls)]
                for s in slots:
                    batch.rollback(s)
                alone = []
                for call in calls:
                    alone.append(np.array(batch.verify_many([call])[0].logits, dtype=np.float64))
                    batch.rollback(call.slot)
                ref = []
                for tokens, r in zip(prefixes, rounds):
                    single.reset()
                    single.extend(tokens[: -1 - n])
                    ref.append(np.array(single.verify(tokens[-1 - n], r).logits, dtype=np.float64))
                    single.rollback()
                single.reset()
            finally:
                for s in slots:
                    batch.close(s)
            out.append(BatchInvarianceCase(
                b, n, max(float(np.max(np.abs(x - y))) for x, y in zip(shared, alone)),
                max(float(np.max(np.abs(x - y))) for x, y in zip(shared, ref))))
    return out


def time_verify_many(batch: BatchBackend, slot_counts: Sequence[int] = (1, 2, 4, 8), prefix_len: int = 128,
                     repeats: int = 5, seed: int = 0) -> list[tuple[int, float, float]]:
    """(B, seconds of one verify_many of B pending-only calls, seconds of B verify_many calls
    of one each), best of `repeats`, prefixes of `prefix_len` random tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in slot_counts:
        slots = [batch.open() for _ in range(b)]
        try:
            for s in slots:
                batch.verify_many([VerifyCall(s, int(rng.integers(100, 20000)), None,
                                              tuple(int(x) for x in rng.integers(100, 20000, prefix_len)))])
                batch.commit(s, ())
            calls = [VerifyCall(s, int(rng.integers(100, 20000)), None) for s in slots]
            rows.append((b, _best(lambda c=calls: _settle(batch, c), repeats),
                         _best(lambda c=calls: [_settle(batch, [call]) for call in c], repeats)))
        finally:
            for s in slots:
                batch.close(s)
    return rows


def _settle(batch: BatchBackend, calls: list[VerifyCall]) -> None:
    batch.verify_many(calls)
    for call in calls:
        batch.rollback(call.slot)


def _best(fn, repeats: int) -> float:
    fn()  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
