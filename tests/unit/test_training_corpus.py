"""The heads' corpus grown past its draw: the draw (and so its validation conversations) is
unchanged, the added conversations are training ones, the code ones picked by `is_code`, and a
recipe without growth keeps the dict (and the cache key) it had."""

from __future__ import annotations

import pytest

from draftwise.errors import InputError
from draftwise.training import corpus
from draftwise.training.corpus import CorpusRecipe, draw_conversations, is_code


@pytest.mark.parametrize("question, answer, expected", [
    ("How do I reverse a list in Python? I get an error", "Use reversed().", True),
    ("Why does this fail?\nfor (int i = 0; i < n; i++) {", "Off by one.", True),
    ("Write a poem about the sea", "```\nwaves\n```", True),
    ("def f(x): return x", "It returns x.", True),
    ("Write a poem about the sea", "The sea is wide.", False),
    ("What is the capital of France?", "Paris.", False),
    ("Tell me about Java, the island", "It is in Indonesia.", False),
])
def test_is_code(question, answer, expected):
    assert is_code(question, answer) is expected


@pytest.fixture
def fake_sharegpt(monkeypatch):
    pairs = [(f"c{i}", f"Write a python function number {i} that fails with an error", "ok") if i % 3 == 0
             else (f"p{i}", f"Tell me a story about the number {i}", "Once upon a time.") for i in range(300)]
    monkeypatch.setattr(corpus, "sharegpt_pairs", lambda limit: iter(pairs[:limit]))
    monkeypatch.setattr(corpus, "evaluation_shingles", lambda: set())


def test_growth_keeps_the_draw_and_adds_training_conversations(fake_sharegpt):
    base, _ = draw_conversations(CorpusRecipe(prompts=20, validation=5, scan=300))
    grown, check = draw_conversations(CorpusRecipe(prompts=20, validation=5, scan=300, code_prompts=10,
                                                   extra_prompts=30))
    assert grown[: len(base)] == base
    added = grown[len(base):]
    assert [c.source for c in added] == ["code"] * 10 + ["extra"] * 30
    assert all(c.split == "train" for c in added)
    assert all(is_code(c.question, c.answer) for c in added[:10])
    keys = [c.key for c in grown]
    assert len(set(keys)) == len(keys)
    assert "code_rule" in check


def test_a_corpus_too_small_for_the_growth_is_refused(fake_sharegpt):
    with pytest.raises(InputError, match="code"):
        draw_conversations(CorpusRecipe(prompts=20, validation=5, scan=300, code_prompts=500))


def test_a_recipe_without_growth_keeps_its_dict():
    assert "code_prompts" not in CorpusRecipe().as_dict() and "extra_prompts" not in CorpusRecipe().as_dict()
    assert CorpusRecipe(code_prompts=3).as_dict()["code_prompts"] == 3
    with pytest.raises(InputError):
        CorpusRecipe(extra_prompts=-1)
