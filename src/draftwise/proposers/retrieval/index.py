"""The REST datastore: build, load (memory-mapped), verify and describe.

On disk an index is an artifact directory (see `draftwise.artifacts`, kind "rest_index"):

    tokens.u32      [T] little-endian uint32: every document followed by the separator id
                        (= vocabulary size, which no tokenizer produces), so no match crosses
                        a document boundary
    suffix.i32|i64  [T] little-endian int32 (int64 when T >= 2**31): suffix array of
                        tokens.u32, built by pydivsufsort (libdivsufsort)
    doc_starts.i64  [D + 1] little-endian int64: start of each document; the last entry is T
    first_token.i64 [S + 2] little-endian int64 (S = separator): suffix-array rows of the
                        suffixes starting with token t are [first[t], first[t + 1])
    manifest.json   corpus snapshot, tokenizer hash, exclusion, layout, policies, sha256s

Tokens are streamed to disk while tokenizing, so a build holds one batch of text in memory
plus the arrays of the suffix-array step.
"""

from __future__ import annotations

import importlib.metadata
import mmap
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from draftwise.artifacts import UNREADABLE, ArtifactError, Manifest, read_manifest, staged_artifact, write_manifest
from draftwise.proposers.retrieval.corpus import CorpusError, CorpusSource, Document, Encoder, read_documents
from draftwise.proposers.retrieval.exclusion import NgramFilter
from draftwise.proposers.retrieval.query import MATCH_SELECTION, QueryConfig, SuffixArrays
from draftwise.proposers.retrieval.trie import COUNTER_DTYPE, PRUNING_POLICY, SIBLING_ORDER

KIND = "rest_index"
BUILDER_VERSION = "1"
TOKENS_FILE = "tokens.u32"
DOCS_FILE = "doc_starts.i64"
FIRST_FILE = "first_token.i64"
BATCH_BYTES = 1 << 21  # text per tokenizer call: big enough for the fast tokenizer's threads


class RestIndexError(ArtifactError):
    """A missing, truncated, tampered or mismatched index."""


class TokenizerMismatch(RestIndexError):
    """The target's tokenizer is not the one the index was built with."""


@dataclass(frozen=True)
class BuildReport:
    directory: str
    documents: int
    excluded: int
    tokens: int  # corpus tokens, separators not counted
    stream_length: int  # tokens + one separator per document
    tokenize_seconds: float
    suffix_array_seconds: float
    total_seconds: float
    disk_bytes: int


# ---- building ------------------------------------------------------------------------------


class _StreamWriter:
    """Appends documents to tokens.u32 and remembers where each one starts."""

    def __init__(self, path: Path, separator: int) -> None:
        self._handle = open(path, "wb")
        self._separator = np.array([separator], dtype="<u4")
        self.starts: list[int] = []
        self.length = 0

    def add(self, ids: np.ndarray) -> None:
        self.starts.append(self.length)
        self._handle.write(ids.astype("<u4", copy=False).tobytes())
        self._handle.write(self._separator.tobytes())
        self.length += ids.shape[0] + 1

    def close(self) -> None:
        self._handle.close()


@dataclass
class _SourceCount:
    documents: int = 0
    excluded: int = 0
    tokens: int = 0
    empty: int = 0
    warnings: list[str] = field(default_factory=list)  # recorded in the manifest


def _batches(documents: Iterable[Document], limit: int = BATCH_BYTES) -> Iterator[list[Document]]:
    batch: list[Document] = []
    size = 0
    for doc in documents:
        batch.append(doc)
        size += len(doc.text)
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    transient=False)


def build_index(
    sources: Sequence[CorpusSource],
    encoder: Encoder,
    out: Path,
    exclusion: NgramFilter | None = None,
    config: QueryConfig = QueryConfig(),
    overwrite: bool = False,
    progress: bool = True,
) -> BuildReport:
    """Tokenize every source with the target's tokenizer, drop contaminated documents, index."""
    if not sources:
        raise CorpusError("no corpus given: an index needs at least one --corpus")
    snapshots = [s.snapshot() for s in sources]  # before reading: what the build claims it read
    total_bytes = sum(s["bytes"] for s in snapshots)
    started = time.perf_counter()
    with _staging(Path(out), overwrite) as staging:
        writer = _StreamWriter(staging / TOKENS_FILE, encoder.vocab_size)
        counts = {s.spec: _SourceCount() for s in sources}
        with _maybe_progress(progress) as bar:
            task = bar.add_task("tokenizing", total=total_bytes) if bar else None
            for source in sources:
                with warnings.catch_warnings(record=True) as caught:  # e.g. a truncated file's tail
                    warnings.simplefilter("always")
                    for batch in _batches(read_documents(source)):
                        _add_batch(batch, encoder, exclusion, writer, counts[source.spec])
                        if bar:
                            bar.advance(task, sum(d.size for d in batch))
                counts[source.spec].warnings.extend(str(w.message) for w in caught)
                for message in counts[source.spec].warnings:
                    warnings.warn(message, stacklevel=2)
        writer.close()
        tokenized = time.perf_counter()
        report = _finish(staging, writer, _provenance(encoder, sources, snapshots, counts, exclusion, config),
                         progress)
    return _report(Path(out), report, started, tokenized)


def build_from_token_documents(
    documents: Iterable[Sequence[int]],
    out: Path,
    vocab_size: int,
    tokenizer_hash: str,
    config: QueryConfig = QueryConfig(),
    overwrite: bool = False,
) -> BuildReport:
    """Index pre-tokenized documents (tests, or callers with their own tokenization)."""
    started = time.perf_counter()
    with _staging(Path(out), overwrite) as staging:
        writer = _StreamWriter(staging / TOKENS_FILE, vocab_size)
        count = _SourceCount()
        for ids in documents:
            array = np.asarray(ids, dtype=np.int64)
            if array.size and (array.min() < 0 or array.max() >= vocab_size):
                raise CorpusError(f"token ids must lie in [0, {vocab_size}); got {array.min()}..{array.max()}")
            _add_one(array, writer, count)
        writer.close()
        tokenized = time.perf_counter()
        tokenizer = {"name": "pre-tokenized", "hash": tokenizer_hash, "vocab_size": vocab_size}
        provenance = _common_provenance(tokenizer, [{"spec": "token-documents", **asdict(count)}], None, config)
        report = _finish(staging, writer, provenance, progress=False)
    return _report(Path(out), report, started, tokenized)


def _add_batch(batch: list[Document], encoder: Encoder, exclusion: NgramFilter | None,
               writer: _StreamWriter, count: _SourceCount) -> None:
    ids = [np.asarray(t, dtype=np.uint32) for t in encoder.encode_batch([d.text for d in batch])]
    dropped = exclusion.contaminated(ids) if exclusion else np.zeros(len(ids), dtype=bool)
    for array, drop in zip(ids, dropped):
        if drop:
            count.excluded += 1
        else:
            _add_one(array, writer, count)


def _add_one(ids: np.ndarray, writer: _StreamWriter, count: _SourceCount) -> None:
    if ids.size == 0:
        count.empty += 1  # an empty document adds nothing a query could match
        return
    writer.add(ids)
    count.documents += 1
    count.tokens += int(ids.size)


def _finish(directory: Path, writer: _StreamWriter, provenance: dict, progress: bool) -> dict:
    """Suffix array, document offsets and manifest for the tokens already written."""
    if writer.length == 0:
        raise CorpusError("the corpus has no tokens (no documents, all empty, or all excluded); refusing an empty index")
    tokens = np.fromfile(directory / TOKENS_FILE, dtype="<u4")  # [T]
    t0 = time.perf_counter()
    suffix = _suffix_array(tokens, progress)  # [T]
    sa_seconds = time.perf_counter() - t0
    suffix_file = f"suffix.i{8 * suffix.dtype.itemsize}"
    suffix.tofile(directory / suffix_file)
    starts = np.array(writer.starts + [writer.length], dtype="<i8")  # [D + 1]
    starts.tofile(directory / DOCS_FILE)
    separator = int(provenance["separator"])
    first = np.zeros(separator + 2, dtype="<i8")  # [S + 2] bucket starts by first token
    np.cumsum(np.bincount(tokens, minlength=separator + 1), out=first[1:])
    first.tofile(directory / FIRST_FILE)
    provenance["layout"] = {
        "tokens": {"file": TOKENS_FILE, "dtype": "<u4", "count": int(tokens.size)},
        "suffix": {"file": suffix_file, "dtype": suffix.dtype.str, "count": int(suffix.size)},
        "doc_starts": {"file": DOCS_FILE, "dtype": "<i8", "count": int(starts.size)},
        "first_token": {"file": FIRST_FILE, "dtype": "<i8", "count": int(first.size)},
    }
    provenance["totals"] = {"documents": len(writer.starts), "stream_length": int(tokens.size),
                            "tokens": int(tokens.size) - len(writer.starts)}
    write_manifest(directory, KIND, provenance)
    return {"suffix_array_seconds": sa_seconds, "provenance": provenance}


def _suffix_array(tokens: np.ndarray, progress: bool) -> np.ndarray:
    from pydivsufsort import divsufsort

    if progress:
        from rich.console import Console

        with Console(stderr=True).status(f"suffix array over {tokens.size:,} tokens (pydivsufsort)"):
            suffix = divsufsort(tokens)
    else:
        suffix = divsufsort(tokens)
    dtype = "<i4" if tokens.size < 2**31 else "<i8"
    return np.ascontiguousarray(suffix.astype(dtype, copy=False))


def _provenance(encoder: Encoder, sources: Sequence[CorpusSource], snapshots: list[dict],
                counts: Mapping[str, _SourceCount], exclusion: NgramFilter | None, config: QueryConfig) -> dict:
    tokenizer = {"name": encoder.name, "hash": encoder.hash, "vocab_size": encoder.vocab_size}
    corpus = [{**snap, **asdict(counts[s.spec])} for s, snap in zip(sources, snapshots)]
    return _common_provenance(tokenizer, corpus, exclusion, config)


def _common_provenance(tokenizer: dict, corpus: list[dict], exclusion: NgramFilter | None, config: QueryConfig) -> dict:
    excluded = sum(c.get("excluded", 0) for c in corpus)
    return {
        "builder": {"name": "draftwise.rest_index", "version": BUILDER_VERSION,
                    "pydivsufsort": importlib.metadata.version("pydivsufsort")},
        "tokenizer": tokenizer,
        "corpus": corpus,
        "exclusion": None if exclusion is None else {**exclusion.describe(), "excluded_documents": excluded},
        "key_encoding": "token ids as uint32; each document followed by the separator id",
        "separator": tokenizer["vocab_size"],
        "endianness": "little",
        "query": asdict(config),  # context (suffix) and continuation lengths, matches per query
        "match_selection": MATCH_SELECTION,
        "counter": {"dtype": np.dtype(COUNTER_DTYPE).name, "meaning": "prefix count of retrieved continuations"},
        "trie": {"sibling_order": SIBLING_ORDER, "pruning": PRUNING_POLICY},
    }


def _report(out: Path, finished: dict, started: float, tokenized: float) -> BuildReport:
    totals = finished["provenance"]["totals"]
    excluded = sum(c.get("excluded", 0) for c in finished["provenance"]["corpus"])
    return BuildReport(
        directory=str(out), documents=totals["documents"], excluded=excluded, tokens=totals["tokens"],
        stream_length=totals["stream_length"], tokenize_seconds=tokenized - started,
        suffix_array_seconds=finished["suffix_array_seconds"], total_seconds=time.perf_counter() - started,
        disk_bytes=sum(p.stat().st_size for p in out.iterdir() if p.is_file()),
    )


class _maybe_progress:
    def __init__(self, enabled: bool) -> None:
        self._bar = _progress() if enabled else None

    def __enter__(self):
        if self._bar:
            self._bar.__enter__()
        return self._bar

    def __exit__(self, *exc) -> None:
        if self._bar:
            self._bar.__exit__(*exc)


@contextmanager
def _staging(out: Path, overwrite: bool) -> Iterator[Path]:
    """An existing index is replaced only with `overwrite`; then artifacts.staged_artifact builds
    beside `out` and moves it into place only when complete.  Besides an index or an empty
    directory it also replaces a corrupt one (a manifest that no longer parses is most likely
    an interrupted or damaged copy of this index) and refuses anything else."""
    if out.exists() and not overwrite:
        raise RestIndexError(f"{out} already exists; pass overwrite (CLI: --force) to replace it")
    with staged_artifact(out, KIND, also_replaces=(UNREADABLE,)) as path:
        yield path


# ---- loading -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RestIndex:
    """A loaded index: arrays are read-only views over memory maps of the files."""

    directory: Path
    manifest: Manifest
    arrays: SuffixArrays
    doc_starts: np.ndarray  # [D + 1] int64
    _maps: tuple[mmap.mmap, ...] = field(repr=False, default=())

    @classmethod
    def open(cls, directory: Path, verify: bool = True) -> "RestIndex":
        """Load an index; with `verify` every file's sha256 is re-checked (sizes always are)."""
        directory = Path(directory)
        manifest = read_manifest(directory, kind=KIND, verify=verify)
        try:
            layout = manifest.provenance["layout"]
            unbound = [layout[role]["file"] for role in ("tokens", "suffix", "doc_starts", "first_token")
                       if layout[role]["file"] not in manifest.files]
        except (KeyError, TypeError) as exc:
            raise ArtifactError(f"{directory}: the manifest's layout is incomplete ({exc!r})") from exc
        if unbound:
            raise ArtifactError(f"{directory}: the manifest does not bind {', '.join(unbound)}: it would load unchecked")
        maps, views = [], {}
        for role in ("tokens", "suffix", "doc_starts", "first_token"):
            spec = layout[role]
            view, handle = _map_array(directory / spec["file"], spec["dtype"], spec["count"])
            maps.append(handle)
            views[role] = view
        arrays = SuffixArrays(views["tokens"], views["suffix"], int(manifest.provenance["separator"]),
                              views["first_token"])
        return cls(directory, manifest, arrays, views["doc_starts"], tuple(maps))

    @property
    def provenance(self) -> Mapping[str, Any]:
        return self.manifest.provenance

    @property
    def tokenizer_hash(self) -> str:
        return self.provenance["tokenizer"]["hash"]

    @property
    def query_config(self) -> QueryConfig:
        return QueryConfig(**self.provenance["query"])

    @property
    def num_tokens(self) -> int:
        return int(self.provenance["totals"]["tokens"])

    def check_tokenizer(self, target_tokenizer_hash: str) -> None:
        if target_tokenizer_hash != self.tokenizer_hash:
            raise TokenizerMismatch(
                f"index {self.directory} was built with tokenizer {self.provenance['tokenizer']['name']!r} "
                f"(hash {self.tokenizer_hash[:16]}…), but the target's tokenizer hash is "
                f"{target_tokenizer_hash[:16]}…; token ids would not mean the same text. Rebuild the index "
                "with --target set to this model."
            )

    def memory_bytes(self) -> int:
        """Bytes mapped for queries (resident only as pages are touched)."""
        arrays = (self.arrays.tokens, self.arrays.suffix, self.doc_starts, self.arrays.first_token)
        return sum(a.nbytes for a in arrays if a is not None)


def _map_array(path: Path, dtype: str, count: int) -> tuple[np.ndarray, mmap.mmap]:
    expected = np.dtype(dtype).itemsize * count
    if not path.is_file():
        raise RestIndexError(f"{path} is missing")
    actual = path.stat().st_size
    if actual != expected:
        raise RestIndexError(f"{path} is truncated or corrupt: {actual} bytes, the manifest says {expected}")
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=np.dtype(dtype), count=count), mapped


def verify_index(directory: Path) -> Manifest:
    """Re-check every checksum and every array size; raise RestIndexError/ArtifactError naming the file."""
    index = RestIndex.open(directory, verify=True)
    return index.manifest


def index_info(directory: Path) -> dict:
    """The manifest's provenance plus file sizes (no checksums re-computed)."""
    manifest = read_manifest(Path(directory), kind=KIND, verify=False)
    sizes = {name: (Path(directory) / name).stat().st_size for name in manifest.files if (Path(directory) / name).is_file()}
    return {"hash": manifest.hash, "files": dict(manifest.files), "file_bytes": sizes, **manifest.provenance}
