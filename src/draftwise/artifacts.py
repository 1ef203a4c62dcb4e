"""Artifacts: a directory with `manifest.json` (kind, provenance, versions, sha256 of every
file) and data files in safetensors, JSON or raw little-endian arrays.  Nothing is ever
unpickled: loading an artifact executes no code.  Every load re-checks the checksums, so a
truncated or tampered file is refused with a message naming it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from draftwise.errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def stable_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj` (sorted keys): the hash of a configuration."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    kind: str
    provenance: Mapping[str, Any]
    files: Mapping[str, str]  # relative file name -> sha256

    @property
    def hash(self) -> str:
        """Content hash: binds the kind, the provenance and every file's checksum."""
        return stable_hash({"kind": self.kind, "provenance": self.provenance, "files": self.files})


def write_manifest(directory: Path, kind: str, provenance: Mapping[str, Any]) -> Manifest:
    """Checksum every file already written in `directory` and write the manifest last."""
    directory = Path(directory)
    files = {
        p.relative_to(directory).as_posix(): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = Manifest(kind=kind, provenance=dict(provenance), files=files)
    body = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "provenance": manifest.provenance,
        "files": files,
        "hash": manifest.hash,
    }
    (directory / MANIFEST).write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
    return manifest


UNREADABLE = "<unreadable manifest>"


def manifest_kind(directory: Path) -> str | None:
    """The kind `directory`'s manifest declares (read, not verified); None without a manifest,
    UNREADABLE when there is one that does not parse."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return UNREADABLE
    return str(body.get("kind")) if isinstance(body, dict) else UNREADABLE


def check_out(directory: Path, kind: str, also_replaces: tuple[str, ...] = ()) -> None:
    """Refuse an output directory `staged_artifact` would refuse, before any work is done for it:
    a symbolic link, a regular file, or a directory that is neither empty nor an artifact of
    `kind` (or of a kind in `also_replaces`)."""
    directory = Path(directory)
    if directory.is_symlink():
        raise ArtifactError(f"{directory} is a symbolic link; give the artifact's real directory")
    replaceable = (kind, *also_replaces)
    if directory.exists() and not (directory.is_dir() and (manifest_kind(directory) in replaceable or not any(directory.iterdir()))):
        raise ArtifactError(f"{directory} exists and is not a {kind!r} artifact; refusing to write over it")


@contextmanager
def staged_artifact(directory: Path, kind: str, also_replaces: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a fresh staging directory beside `directory` to write an artifact of `kind` into,
    and move it into place only once the body has finished: an error leaves no half-written
    artifact, and the old artifact is set aside (not deleted) until the new one is in place.
    An existing `directory` is replaced only when it is empty or holds an artifact of the same
    kind (an --out that names an input artifact, or a working tree, is refused before anything
    is written), or of a kind in `also_replaces` (e.g. UNREADABLE: a corrupt copy of the same
    artifact); a symbolic link is refused rather than followed. The staging name is unique, so a
    user's directory that happens to share it is never touched."""
    directory = Path(directory)
    check_out(directory, kind, also_replaces)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{directory.name}.partial-", dir=directory.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{directory.name}.old-", dir=directory.parent))
        directory.rename(old / directory.name)
    staging.rename(directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(directory: Path, kind: str | None = None, verify: bool = True,
                  required: tuple[str, ...] = ()) -> Manifest:
    """Read and (by default) verify an artifact; raise ArtifactError naming the first bad file.
    `required`: the data files the loader will read, which the manifest must bind."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory} is not a draftwise artifact: {MANIFEST} is missing")
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # not JSON, or not even UTF-8 (a garbage or binary file)
        raise ArtifactError(f"{path} is not valid JSON: {exc}") from exc
    if (not isinstance(body, dict) or not isinstance(body.get("provenance"), dict) or not isinstance(body.get("files"), dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in body["files"].items())):
        raise ArtifactError(f"{path} is not a draftwise manifest (it needs kind, provenance and files: name -> sha256)")
    if body.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path} has format version {body.get('format_version')!r}; this draftwise reads {FORMAT_VERSION}")
    if kind is not None and body.get("kind") != kind:
        raise ArtifactError(f"{directory} holds a {body.get('kind')!r} artifact, expected {kind!r}")
    manifest = Manifest(kind=body.get("kind"), provenance=body["provenance"], files=body["files"])
    if body.get("hash") != manifest.hash:
        raise ArtifactError(f"{path} was edited after it was written: its recorded hash does not match its content")
    for name in manifest.files:
        _inside(directory, name)
    unbound = [name for name in required if name not in manifest.files]
    if unbound:
        raise ArtifactError(f"{path} does not bind {', '.join(unbound)}: the file would load unchecked")
    if verify:
        verify_files(directory, manifest)
    return manifest


def _inside(directory: Path, name: str) -> Path:
    """The file `name` of an artifact, refused if it resolves outside the artifact's directory."""
    root = Path(directory).resolve()
    file = (root / name).resolve()
    if root not in file.parents:
        raise ArtifactError(f"{Path(directory) / MANIFEST} lists {name!r}, which lies outside the artifact")
    return file


def verify_files(directory: Path, manifest: Manifest, stamps: Path | None = None) -> None:
    """Re-check every file's sha256.  With `stamps` (a directory outside the artifact), a file
    whose size and modification time match the stamp of its last full check is not re-read."""
    for name, expected in manifest.files.items():
        file = _inside(directory, name)
        if not file.is_file():
            raise ArtifactError(f"{Path(directory) / name} is listed in the manifest but missing")
        actual = checked_sha256(file, stamp_path(stamps, name)) if stamps else sha256_file(file)
        if actual != expected:
            raise ArtifactError(
                f"{Path(directory) / name} is corrupt or was tampered with: sha256 {actual[:16]}… != manifest {expected[:16]}…"
            )


def stamp_path(stamps: Path, name: str) -> Path:
    """The stamp of an artifact's file `name` in the stamps directory `stamps`."""
    return Path(stamps) / f"{name.replace('/', '__')}.json"


def _identity(path: Path) -> dict:
    """What changes whenever a file's bytes can have: size, inode, mtime and ctime (ctime cannot be
    set back by `utime`, so a same-size swap that restores the mtime, `cp -p`, `rsync -t`, still shows)."""
    info = Path(path).stat()
    return {"size": info.st_size, "inode": info.st_ino, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns}


def checked_sha256(path: Path, stamp: Path) -> str:
    """sha256 of `path`, hashed again only when its identity (size, inode, mtime, ctime) differs
    from `stamp`, the record of its last full hash.  `draftwise models verify` and `index
    verify` always hash in full."""
    before = _identity(path)
    try:
        recorded = json.loads(Path(stamp).read_text())
    except (OSError, ValueError):
        recorded = {}
    if isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str) and recorded.get("file") == before:
        return recorded["sha256"]
    digest = sha256_file(path)
    write_stamp(path, digest, stamp, before)
    return digest


def write_stamp(path: Path, digest: str, stamp: Path, before: dict | None = None) -> None:
    """Record that `path` hashes to `digest`.  `before`: its identity when the hash began; a file
    that changed while it was being hashed gets no stamp (the next load hashes it again).  The
    stamp is an optimisation: a cache that cannot be written (read-only) just goes unstamped."""
    now = _identity(path)
    if before is not None and before != now:
        return
    try:
        Path(stamp).parent.mkdir(parents=True, exist_ok=True)
        Path(stamp).write_text(json.dumps({"file": now, "sha256": digest}))
    except OSError:
        pass
