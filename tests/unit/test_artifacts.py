"""Artifact manifests: what a manifest binds, what a loader refuses, and how writes land."""

from __future__ import annotations

import json
import os

import pytest

from draftwise.artifacts import (
    MANIFEST,
    ArtifactError,
    checked_sha256,
    read_manifest,
    sha256_file,
    staged_artifact,
    verify_files,
    write_manifest,
)


def make(directory, kind="demo", files=None):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {"data.json": "{}"}).items():
        (directory / name).write_text(text)
    return write_manifest(directory, kind, {"what": "test"})


def rewrite(directory, edit):
    body = json.loads((directory / MANIFEST).read_text())
    edit(body)
    (directory / MANIFEST).write_text(json.dumps(body))


def test_a_manifest_without_its_fields_or_of_another_format_is_refused_not_a_crash(tmp_path):
    make(tmp_path / "a")
    (tmp_path / "a" / MANIFEST).write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="not a draftwise manifest"):
        read_manifest(tmp_path / "a")
    make(tmp_path / "b")
    rewrite(tmp_path / "b", lambda body: body.update(format_version=99))
    with pytest.raises(ArtifactError, match="format version 99"):
        read_manifest(tmp_path / "b")


def test_a_listed_name_outside_the_artifact_is_refused(tmp_path):
    (tmp_path / "secret.txt").write_text("outside")
    artifact = tmp_path / "a"
    make(artifact)
    files = {"../secret.txt": sha256_file(tmp_path / "secret.txt")}
    body = json.loads((artifact / MANIFEST).read_text())
    from draftwise.artifacts import Manifest

    manifest = Manifest(body["kind"], body["provenance"], files)
    rewrite(artifact, lambda b: b.update(files=files, hash=manifest.hash))  # a consistent, hostile manifest
    with pytest.raises(ArtifactError, match="outside the artifact"):
        read_manifest(artifact)


def test_a_loader_refuses_a_data_file_the_manifest_does_not_bind(tmp_path):
    artifact = tmp_path / "a"
    make(artifact, files={"other.json": "{}"})
    (artifact / "data.json").write_text("{}")  # added after the manifest: unchecked
    with pytest.raises(ArtifactError, match="does not bind data.json"):
        read_manifest(artifact, required=("data.json",))
    assert read_manifest(artifact, required=("other.json",)).kind == "demo"


def test_a_staged_write_replaces_only_its_own_kind_and_leaves_nothing_on_error(tmp_path):
    source = tmp_path / "acceptance"
    make(source, kind="acceptance")
    with pytest.raises(ArtifactError, match="not a 'tree' artifact"):  # --out naming the input artifact
        with staged_artifact(source, "tree"):
            pass
    assert read_manifest(source).kind == "acceptance"  # untouched
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="refusing to write over it"):
        with staged_artifact(work, "tree"):
            pass
    out = tmp_path / "tree"
    with pytest.raises(RuntimeError):
        with staged_artifact(out, "tree") as staging:
            (staging / "data.json").write_text("{}")
            raise RuntimeError("the optimizer failed")
    assert not out.exists() and not (tmp_path / "tree.partial").exists()
    with staged_artifact(out, "tree") as staging:
        make(staging, kind="tree")
    with staged_artifact(out, "tree") as staging:  # the same kind is replaced whole
        make(staging, kind="tree", files={"new.json": "{}"})
    assert set(read_manifest(out).files) == {"new.json"}


def test_a_stamp_spares_rehashing_an_unchanged_file_and_any_change_rehashes(tmp_path):
    data, stamp = tmp_path / "model.bin", tmp_path / "stamps" / "model.json"
    data.write_bytes(b"weights" * 1000)
    digest = checked_sha256(data, stamp)
    assert digest == sha256_file(data) and stamp.is_file()
    recorded = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**recorded, "sha256": "f" * 64}))  # a stale stamp is believed only if...
    assert checked_sha256(data, stamp) == "f" * 64  # ...the file's identity still matches (no re-read)
    data.write_bytes(b"weights" * 999)  # truncated: the size changes
    assert checked_sha256(data, stamp) == sha256_file(data) != digest
    same_size = b"Weights" * 999
    data.write_bytes(same_size)
    os.utime(data, ns=(1, 1))  # replaced with the same size: the modification time differs
    assert checked_sha256(data, stamp) == sha256_file(data)


def test_verify_files_with_stamps_still_catches_tampering(tmp_path):
    artifact = tmp_path / "a"
    manifest = make(artifact, files={"w.bin": "0123456789"})
    verify_files(artifact, manifest, stamps=tmp_path / "stamps")
    (artifact / "w.bin").write_text("0123456780")
    os.utime(artifact / "w.bin", ns=(5, 5))
    with pytest.raises(ArtifactError, match="w.bin is corrupt"):
        verify_files(artifact, manifest, stamps=tmp_path / "stamps")


def test_a_staged_write_never_deletes_what_it_did_not_make(tmp_path):
    mine = tmp_path / "tree.partial"  # a user's directory that merely shares the old staging name
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    empty = tmp_path / "tree"
    empty.mkdir()  # an empty --out is fine
    with staged_artifact(empty, "tree") as staging:
        assert staging != mine
        make(staging, kind="tree")
    assert (mine / "keep.txt").read_text() == "mine" and read_manifest(empty).kind == "tree"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree", "tree.partial"]  # no staging or old copies left
    link = tmp_path / "link"
    link.symlink_to(empty)
    with pytest.raises(ArtifactError, match="symbolic link"):
        with staged_artifact(link, "tree"):
            pass


def test_a_stamp_is_not_fooled_by_a_same_size_swap_that_restores_the_mtime(tmp_path):
    data, stamp = tmp_path / "model.bin", tmp_path / "model.json"
    data.write_bytes(b"a" * 100)
    checked_sha256(data, stamp)
    mtime = data.stat().st_mtime_ns
    data.write_bytes(b"b" * 100)  # same size
    os.utime(data, ns=(mtime, mtime))  # and the old mtime back (cp -p, rsync -t): the ctime still moved
    assert checked_sha256(data, stamp) == sha256_file(data)


def test_a_cache_that_cannot_take_stamps_still_verifies(tmp_path):
    data = tmp_path / "model.bin"
    data.write_bytes(b"w" * 10)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the stamps directory would go")
    assert checked_sha256(data, blocked / "model.json") == sha256_file(data)  # no stamp written, no error
