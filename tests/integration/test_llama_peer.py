"""The llama-cpp-python peers as `draftwise bench` loads them, on the embedded SmolLM2 GGUF.

Like for like: `llamacpp-plain:feed=draftwise` feeds the prompt as draftwise's engine does (all
but the last token, then that token alone in the first step) and equals draftwise's llama.cpp
plain decoding token for token, while `llamacpp-plain` as users run it (the whole prompt in one
batch) parts from it on prompts whose last row llama.cpp computes differently alone and in a
batch (see `bench/peers.py`).

Regression: llama-cpp-python 0.3.36 keeps logits for every row when it has a draft model but sizes
its score buffer by the constructor's `logits_all`, i.e. n_batch = 512 rows by default, so the
prompt-lookup peer crashed (numpy broadcast error) once a generation ran past position 512 —
first seen on Spec-Bench question 133's second turn in the reference run.
"""

import io
import json
import logging

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.bench.pool import ModelPool  # noqa: E402
from draftwise.workloads import parse_workload  # noqa: E402

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


# Spec-Bench development questions whose first turn, decoded greedily by draftwise's llama.cpp
# backend on SmolLM2 Q4_1 with 2 threads, parts from the whole-prompt feed within 32 tokens
# (at tokens 8, 17 and 17 on the machine they were picked on, from a scan of the split's first turns)
FEED_SENSITIVE = ("83", "186", "324")


def test_llamacpp_plain_fed_like_draftwise_equals_draftwise_plain(tmp_path):
    from rich.console import Console

    from draftwise.bench.main import run_bench
    from draftwise.bench.runner import BenchSettings

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    questions = {q.question_id: q for q in parse_workload("spec-bench").questions}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": questions[i].turns[0]}) + "\n" for i in FEED_SENSITIVE))
    settings = BenchSettings(workloads=(f"prompts:{prompts}",),
                             methods=("dw-plain=dw:proposer=none,backend=llamacpp", "llamacpp-plain",
                                      "like=llamacpp-plain:feed=draftwise"),
                             target="smollm2-135m", max_new_tokens=32, threads=2, warmup_tokens=2)
    summary = run_bench(settings, tmp_path / "run", show_progress=False, console=Console(file=io.StringIO()))
    like, users = summary["methods"]["like"], summary["methods"]["llamacpp-plain"]
    assert like["reference"] == users["reference"] == "dw-plain"
    assert like["overall"]["compared_turns"] == len(FEED_SENSITIVE)
    assert like["overall"]["mismatches"] == 0  # token for token on every prompt
    # and the prompts tell the feeds apart: fed whole, as users run it, the peer parts from draftwise plain
    assert users["overall"]["mismatches"] >= 1
