"""The engine on the llama.cpp backend: greedy output token-identical to plain greedy decoding
on the same backend, with prompt lookup (chain and tree) and a draft model."""

import logging

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.backends.llamacpp import LlamaCppBackend  # noqa: E402
from draftwise.engine import GenerationConfig, SpeculativeDecoder  # noqa: E402
from draftwise.models import resolve  # noqa: E402
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer  # noqa: E402
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer  # noqa: E402
from draftwise.verify.greedy import GreedyVerifier  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]
NEW = 48
CONFIG = GenerationConfig(max_new_tokens=NEW)


@pytest.fixture(scope="module")
def target():
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    backend = LlamaCppBackend.load(resolve("smollm2-135m"), n_ctx=2048, max_tree_leaves=8)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def draft():
    backend = LlamaCppBackend.load(resolve("smollm2-135m"), n_ctx=2048, max_tree_leaves=0)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompts_and_plain(target, spec_bench_prompts):
    prompts = [target.chat_prompt([{"role": "user", "content": t}]) for t in spec_bench_prompts]
    return prompts, [SpeculativeDecoder(target, [], GreedyVerifier(), CONFIG).generate(p).tokens for p in prompts]


@pytest.mark.parametrize("candidates", [1, 4])
def test_prompt_lookup_identical_to_plain(target, prompts_and_plain, candidates):
    prompts, plain = prompts_and_plain
    proposer = PromptLookupProposer(PromptLookupConfig(max_candidates=candidates))
    drafted = 0
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(target, [proposer], GreedyVerifier(), CONFIG).generate(prompt)
        assert result.tokens == reference
        drafted += sum(result.from_draft)
    assert drafted > 0


def test_draft_model_identical_to_plain(target, draft, prompts_and_plain):
    prompts, plain = prompts_and_plain
    proposer = DraftModelProposer(draft, target.info.tokenizer_hash, DraftConfig(k=4, confidence_threshold=0.0))
    accepted = 0
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(target, [proposer], GreedyVerifier(), CONFIG).generate(prompt)
        assert result.tokens == reference
        accepted += sum(result.from_draft)
    assert accepted > NEW * len(prompts) * 0.6  # the draft IS the target: nearly everything is accepted
