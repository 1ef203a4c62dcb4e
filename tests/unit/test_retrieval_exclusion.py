"""Evaluation exclusion: a planted benchmark answer is dropped, the rest kept and counted."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from draftwise.proposers.retrieval.corpus import resolve_source
from draftwise.proposers.retrieval.exclusion import HUMANEVAL, NgramFilter, humaneval_path, load_eval_set, window_hashes
from draftwise.proposers.retrieval.index import RestIndex, build_index, index_info
from tests.helpers import ByteEncoder




def test_window_hashes_match_equal_windows_only():
    a = window_hashes(np.array([1, 2, 3, 4, 5]), 3)
    b = window_hashes(np.array([9, 2, 3, 4, 0]), 3)
    assert a.shape == (3,) and a[1] == b[1] and a[0] != b[0] and a[2] != b[2]
    assert window_hashes(np.array([1, 2]), 3).size == 0
    assert window_hashes(np.array([0, 0, 0]), 3)[0] != window_hashes(np.array([0, 0, 1]), 3)[0]


def test_planted_humaneval_solution_is_excluded(tmp_path):
    with gzip.open(humaneval_path(), "rt") as handle:
        problem = json.loads(handle.readline())
    corpus = tmp_path / "corpus.jsonl"
    lines = [
        {"text": "Minutes of the garden committee: tulips ordered, fence painted green."},
        {"text": "# a copied benchmark answer\n" + problem["canonical_solution"] + "\n# end"},
        {"text": "Weather report: clear skies over the harbour, light wind from the west."},
    ]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # 50 UTF-8 bytes: the byte stand-in's equivalent of ~13 code tokens
    exclusion = NgramFilter.from_eval_sets([load_eval_set(HUMANEVAL)], ByteEncoder(), n=50)
    report = build_index([resolve_source(str(corpus))], ByteEncoder(), tmp_path / "idx", exclusion, progress=False)
    assert (report.documents, report.excluded) == (2, 1)
    info = index_info(tmp_path / "idx")
    assert info["exclusion"]["excluded_documents"] == 1 and info["exclusion"]["ngram_tokens"] == 50
    assert info["exclusion"]["eval_sets"][0]["name"] == HUMANEVAL
    assert info["exclusion"]["eval_sets"][0]["texts"] == 3 * 164
    assert info["corpus"][0]["excluded"] == 1
    stream = bytes(RestIndex.open(tmp_path / "idx").arrays.tokens[:-1].astype(np.uint8)).decode(errors="replace")
    assert "garden" in stream and "harbour" in stream and "benchmark answer" not in stream


def test_spec_bench_turns_and_references_are_excluded(tmp_path):
    questions = tmp_path / "question.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing",
                                     "turns": ["Write a haiku about the lighthouse keeper's orange cat."],
                                     "reference": ["The keeper's orange cat sleeps under the great lamp."]}) + "\n")
    eval_set = load_eval_set(str(questions))
    assert len(eval_set.texts) == 2
    exclusion = NgramFilter.from_eval_sets([eval_set], ByteEncoder(), n=30)
    docs = [np.frombuffer(t.encode(), dtype=np.uint8).astype(np.uint32) for t in (
        "Blog: write a haiku about the lighthouse keeper's orange cat, they said.",  # the turn
        "Unrelated: the keeper's orange cat sleeps under the great lamp every night.",  # the reference
        "Visit the lighthouse keeper; a haiku about it.",  # shares only windows shorter than 30 bytes
        "Totally unrelated text about bread baking and sourdough starters.",
    )]
    assert exclusion.contaminated(docs).tolist() == [True, True, False, False]


def test_an_ngram_length_below_one_is_refused_not_a_silent_no_op():
    with pytest.raises(ValueError, match="n-gram length"):
        NgramFilter.from_eval_sets([load_eval_set(HUMANEVAL)], ByteEncoder(), n=0)
