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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class ArtifactError(ValueError):
    """A missing, corrupt, tampered or mismatched artifact."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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


def read_manifest(directory: Path, kind: str | None = None, verify: bool = True) -> Manifest:
    """Read and (by default) verify an artifact; raise ArtifactError naming the first bad file."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory} is not a draftwise artifact: {MANIFEST} is missing")
    try:
        body = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path} is not valid JSON: {exc}") from exc
    if kind is not None and body.get("kind") != kind:
        raise ArtifactError(f"{directory} holds a {body.get('kind')!r} artifact, expected {kind!r}")
    manifest = Manifest(kind=body["kind"], provenance=body["provenance"], files=body["files"])
    if body.get("hash") != manifest.hash:
        raise ArtifactError(f"{path} was edited after it was written: its recorded hash does not match its content")
    if verify:
        verify_files(directory, manifest)
    return manifest


def verify_files(directory: Path, manifest: Manifest) -> None:
    for name, expected in manifest.files.items():
        file = Path(directory) / name
        if not file.is_file():
            raise ArtifactError(f"{file} is listed in the manifest but missing")
        actual = sha256_file(file)
        if actual != expected:
            raise ArtifactError(
                f"{file} is corrupt or was tampered with: sha256 {actual[:16]}… != manifest {expected[:16]}…"
            )
