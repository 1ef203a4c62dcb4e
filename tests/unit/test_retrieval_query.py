"""Longest-suffix search and continuations over a real (tiny) suffix-array index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from draftwise.proposers.retrieval.index import RestIndex, build_from_token_documents
from draftwise.proposers.retrieval.query import NO_MATCH, QueryConfig, longest_match, retrieve, select_rows, suffix_range
from draftwise.proposers.retrieval.trie import PAD


def index_of(tmp_path: Path, docs: list[list[int]], vocab: int = 12) -> RestIndex:
    build_from_token_documents(docs, tmp_path / "idx", vocab_size=vocab, tokenizer_hash="test")
    return RestIndex.open(tmp_path / "idx")


def real(rows: np.ndarray) -> list[list[int]]:
    return [[int(t) for t in row if t != PAD] for row in rows]


def test_fixture_continuations(tmp_path):
    index = index_of(tmp_path, [[4, 5, 6, 9, 4, 5, 6, 10, 11]])
    match, rows = retrieve(index.arrays, [4, 5, 6], QueryConfig())
    assert match.length == 3 and match.count == 2
    assert real(rows) == [[9, 4, 5, 6, 10, 11], [10, 11]]


def test_longest_suffix_wins_and_shorter_one_is_the_fallback(tmp_path):
    index = index_of(tmp_path, [[1, 2, 3, 4, 9], [7, 2, 3, 4, 8]])
    match, rows = retrieve(index.arrays, [1, 2, 3, 4], QueryConfig())
    assert match.length == 4 and real(rows) == [[9]]
    match, rows = retrieve(index.arrays, [5, 2, 3, 4], QueryConfig())
    assert match.length == 3 and sorted(real(rows)) == [[8], [9]]


def test_no_match_crosses_a_document_boundary(tmp_path):
    index = index_of(tmp_path, [[1, 2, 3], [4, 5, 6]])
    assert longest_match(index.arrays, [2, 3, 4], QueryConfig()) == NO_MATCH
    match, rows = retrieve(index.arrays, [1, 2, 3], QueryConfig())
    assert match.length == 3 and real(rows) == [[]]  # the continuation stops at the boundary
    _, rows = retrieve(index.arrays, [0, 1, 2], QueryConfig(continuation_length=5))
    assert real(rows) == [[3]]


def test_min_and_max_suffix(tmp_path):
    index = index_of(tmp_path, [[1, 2, 3, 4, 5, 6, 7]])
    assert longest_match(index.arrays, [9, 6], QueryConfig(min_suffix=2)) == NO_MATCH
    assert longest_match(index.arrays, [9, 6], QueryConfig(min_suffix=1)).length == 1
    assert longest_match(index.arrays, [1, 2, 3, 4, 5], QueryConfig(max_suffix=3)).length == 3
    assert longest_match(index.arrays, [5], QueryConfig()) == NO_MATCH  # shorter than min_suffix
    assert longest_match(index.arrays, [4, 99], QueryConfig()) == NO_MATCH  # id outside the vocabulary
    assert longest_match(index.arrays, [99, 4, 5], QueryConfig()).length == 2  # usable after it


def test_suffix_range_agrees_with_brute_force(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 4, size=int(rng.integers(1, 30))).tolist() for _ in range(20)]
    index = index_of(tmp_path, docs, vocab=4)
    assert np.array_equal(
        index.arrays.suffix,
        sorted(range(len(index.arrays.tokens)), key=lambda i: index.arrays.tokens[i:].tolist()),
    )
    for _ in range(200):
        pattern = rng.integers(0, 4, size=int(rng.integers(1, 5))).tolist()
        lo, hi = suffix_range(index.arrays, pattern)
        naive = sum(d[i : i + len(pattern)] == pattern for d in docs for i in range(len(d)))
        assert hi - lo == naive
        starts = {int(index.arrays.suffix[r]) for r in range(lo, hi)}
        assert all(index.arrays.tokens[s : s + len(pattern)].tolist() == pattern for s in starts)


def test_max_matches_takes_evenly_spaced_rows(tmp_path):
    index = index_of(tmp_path, [[1, 2, t] for t in range(3, 11)])
    match, rows = retrieve(index.arrays, [1, 2], QueryConfig(max_matches=4))
    assert match.count == 8 and rows.shape == (4, 8)
    assert real(rows) == [[3], [5], [7], [9]]  # rows 0, 2, 4, 6 of the sorted range
    assert select_rows(match, 100).tolist() == list(range(match.lo, match.hi))


def test_query_config_validation():
    with pytest.raises(ValueError):
        QueryConfig(min_suffix=5, max_suffix=4)
    with pytest.raises(ValueError):
        QueryConfig(max_matches=0)
