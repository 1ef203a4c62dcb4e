"""Building, loading and verifying indexes: readers, manifest, tampering, truncation, emptiness."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftwise.artifacts import ArtifactError
from draftwise.proposers.retrieval.corpus import CorpusError, read_documents, resolve_source
from draftwise.proposers.retrieval.index import (
    RestIndex,
    RestIndexError,
    build_from_token_documents,
    build_index,
    index_info,
    verify_index,
)
from tests.helpers import ByteEncoder




@pytest.fixture
def fixture_index(tmp_path) -> Path:
    build_from_token_documents([[4, 5, 6, 9, 4, 5, 6, 10, 11]], tmp_path / "idx", vocab_size=12, tokenizer_hash="h")
    return tmp_path / "idx"


def test_manifest_records_layout_and_policies(fixture_index):
    info = index_info(fixture_index)
    assert info["tokenizer"]["hash"] == "h"
    assert info["separator"] == 12 and info["endianness"] == "little"
    assert info["layout"]["tokens"] == {"file": "tokens.u32", "dtype": "<u4", "count": 10}
    assert info["layout"]["suffix"]["dtype"] == "<i4"
    assert info["query"] == {"max_suffix": 16, "min_suffix": 2, "max_matches": 64, "continuation_length": 8}
    assert info["counter"]["dtype"] == "int32" and "pruning" in info["trie"]
    assert set(info["files"]) == {"tokens.u32", "suffix.i32", "doc_starts.i64", "first_token.i64"}
    index = RestIndex.open(fixture_index)
    assert index.arrays.tokens.tolist() == [4, 5, 6, 9, 4, 5, 6, 10, 11, 12]
    assert index.doc_starts.tolist() == [0, 10]
    # tokens 4 (x2), 5 (x2), 6 (x2), 9, 10, 11 and the separator 12: bucket starts by first token
    assert index.arrays.first_token.tolist() == [0, 0, 0, 0, 0, 2, 4, 6, 6, 6, 7, 8, 9, 10]
    assert not index.arrays.tokens.flags.writeable  # a read-only memory map


def test_tampered_file_is_named(fixture_index):
    path = fixture_index / "suffix.i32"
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="suffix.i32"):
        verify_index(fixture_index)
    with pytest.raises(ArtifactError, match="suffix.i32"):
        RestIndex.open(fixture_index)


def test_truncated_file_is_named_even_without_checksums(fixture_index):
    path = fixture_index / "tokens.u32"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ArtifactError, match="tokens.u32"):
        verify_index(fixture_index)
    with pytest.raises(RestIndexError, match="tokens.u32 is truncated"):
        RestIndex.open(fixture_index, verify=False)


def test_edited_manifest_is_refused(fixture_index):
    manifest = fixture_index / "manifest.json"
    body = json.loads(manifest.read_text())
    body["provenance"]["separator"] = 99
    manifest.write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match="edited"):
        RestIndex.open(fixture_index)


def test_empty_corpus_is_an_error(tmp_path):
    with pytest.raises(CorpusError, match="empty index"):
        build_from_token_documents([], tmp_path / "a", vocab_size=12, tokenizer_hash="h")
    with pytest.raises(CorpusError, match="empty index"):
        build_from_token_documents([[], []], tmp_path / "b", vocab_size=12, tokenizer_hash="h")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "notes.txt").write_text("not python")
    with pytest.raises(CorpusError, match="empty index"):
        build_index([resolve_source(str(tmp_path / "tree"))], ByteEncoder(), tmp_path / "c", progress=False)
    assert not list(tmp_path.glob("c*"))  # neither the index nor a staging directory is left
    with pytest.raises(CorpusError):
        build_index([], ByteEncoder(), tmp_path / "d", progress=False)


def test_out_of_vocabulary_ids_and_existing_output_are_refused(fixture_index, tmp_path):
    with pytest.raises(CorpusError):
        build_from_token_documents([[1, 12]], tmp_path / "x", vocab_size=12, tokenizer_hash="h")
    with pytest.raises(RestIndexError, match="already exists"):
        build_from_token_documents([[1]], fixture_index, vocab_size=12, tokenizer_hash="h")
    build_from_token_documents([[1, 2]], fixture_index, vocab_size=12, tokenizer_hash="h", overwrite=True)
    assert RestIndex.open(fixture_index).arrays.tokens.tolist() == [1, 2, 12]


def test_rebuild_replaces_a_corrupt_index_but_not_a_foreign_directory(fixture_index, tmp_path):
    (fixture_index / "manifest.json").write_text("{ truncated")  # an interrupted or damaged copy
    build_from_token_documents([[3]], fixture_index, vocab_size=12, tokenizer_hash="h", overwrite=True)
    assert RestIndex.open(fixture_index).arrays.tokens.tolist() == [3, 12]
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="is not a 'rest_index' artifact; refusing"):
        build_from_token_documents([[3]], work, vocab_size=12, tokenizer_hash="h", overwrite=True)
    assert (work / "notes.txt").read_text() == "mine"
    # a user's directory that shares the name an earlier version staged into is never cleared
    lookalike = tmp_path / "fresh.partial"
    lookalike.mkdir()
    (lookalike / "keep.txt").write_text("mine")
    build_from_token_documents([[4]], tmp_path / "fresh", vocab_size=12, tokenizer_hash="h")
    assert (lookalike / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.glob("fresh*")) == ["fresh", "fresh.partial"]


def test_readers_for_every_corpus_kind(tmp_path):
    tree = tmp_path / "src"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "a.py").write_text("x = 1\n")
    (tree / "b.py").write_text("y = 2\n")
    (tree / "c.txt").write_text("skipped")
    (tmp_path / "docs.jsonl").write_text('{"text": "first"}\n\n{"text": "second"}\n')
    chats = [{"id": "c1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
    (tmp_path / "chat.json").write_text(json.dumps(chats))
    (tmp_path / "plain.txt").write_text("plain text")
    texts = {
        spec: [d.text for d in read_documents(resolve_source(str(tmp_path / spec)))]
        for spec in ("src", "docs.jsonl", "chat.json", "plain.txt")
    }
    assert texts == {"src": ["y = 2\n", "x = 1\n"], "docs.jsonl": ["first", "second"],
                     "chat.json": ["hi", "hello"], "plain.txt": ["plain text"]}
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(CorpusError, match="text"):
        list(read_documents(resolve_source(str(tmp_path / "bad.jsonl"))))
    with pytest.raises(CorpusError):
        resolve_source(str(tmp_path / "missing"))


def test_build_index_from_sources_records_the_snapshot(tmp_path):
    (tmp_path / "a.txt").write_text("abcabd")
    (tmp_path / "b.jsonl").write_text('{"text": "abx"}\n{"text": ""}\n')
    sources = [resolve_source(str(tmp_path / "a.txt")), resolve_source(str(tmp_path / "b.jsonl"))]
    report = build_index(sources, ByteEncoder(), tmp_path / "idx", progress=False)
    assert (report.documents, report.tokens, report.stream_length) == (2, 9, 11)
    info = index_info(tmp_path / "idx")
    assert [c["documents"] for c in info["corpus"]] == [1, 1]
    assert info["corpus"][1]["empty"] == 1
    assert info["corpus"][0]["bytes"] == 6 and len(info["corpus"][0]["sha256"]) == 64
    index = RestIndex.open(tmp_path / "idx")
    assert index.arrays.separator == 256
    assert np.array_equal(index.doc_starts, [0, 7, 11])


def test_sharegpt_file_cut_off_inside_its_last_item_keeps_the_complete_ones(tmp_path):
    whole = json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "one"}]},
                        {"id": "b", "conversations": [{"from": "gpt", "value": "two, cut here"}]}])
    path = tmp_path / "cut.json"
    path.write_text(whole[: whole.index("cut here")])
    with pytest.warns(UserWarning, match="incomplete last item"):
        texts = [d.text for d in read_documents(resolve_source(str(path)))]
    assert texts == ["one"]
    with pytest.warns(UserWarning):
        build_index([resolve_source(str(path))], ByteEncoder(), tmp_path / "idx", progress=False)
    assert "incomplete last item" in index_info(tmp_path / "idx")["corpus"][0]["warnings"][0]
    path.write_text('[{"id": "a", "conversations": []}, {"id": oops}]')
    with pytest.raises(CorpusError, match="malformed"):
        list(read_documents(resolve_source(str(path))))
