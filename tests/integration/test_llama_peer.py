"""The llama-cpp-python peers as `draftwise bench` loads them, on the embedded SmolLM2 GGUF.

Regression: llama-cpp-python 0.3.36 keeps logits for every row when it has a draft model but sizes
its score buffer by the constructor's `logits_all`, i.e. n_batch = 512 rows by default, so the
prompt-lookup peer crashed (numpy broadcast error) once a generation ran past position 512 —
first seen on Spec-Bench question 133's second turn in the reference run.
"""

import logging

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.bench.pool import ModelPool  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]
NEW = 24


def greedy(llama, prompt: list[int]) -> list[int]:
    llama.reset()
    tokens = []
    for token in llama.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0):
        tokens.append(int(token))
        if len(tokens) >= NEW:
            break
    return tokens


def test_prompt_lookup_peer_runs_past_the_batch_size():
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    pool = ModelPool(threads=2, seed=0)
    lookup = pool.llama("smollm2-135m", 10)
    # repetitive text, so the lookup drafts; it straddles position 512 (llama-cpp-python's n_batch)
    text = "def add(a, b):\n    return a + b\n\n" * 60
    prompt = lookup.tokenize(text.encode())[:500]
    assert len(prompt) == 500 and lookup.n_batch == 512
    drafted = greedy(lookup, prompt)
    assert len(drafted) == NEW  # ran to the limit, past row 512, without the broadcast error
    # and it is the same text plain greedy writes (the repetition is far from a near-tie)
    assert drafted == greedy(pool.llama("smollm2-135m", None), prompt)
