"""REST retrieval drafting through the engine: greedy output identical to plain decoding."""

import pytest

from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.retrieval.index import build_from_token_documents
from draftwise.proposers.retrieval.proposer import RestProposer
from draftwise.verify.registry import make_verifier

pytestmark = pytest.mark.model


def test_rest_greedy_identical_to_plain(smol_target, spec_bench_prompts, tmp_path):
    config = GenerationConfig(max_new_tokens=32)
    prompts = [smol_target.chat_prompt([{"role": "user", "content": t}]) for t in spec_bench_prompts[:4]]
    plain = [SpeculativeDecoder(smol_target, [], make_verifier("greedy", [], config.policy), config).generate(p).tokens
             for p in prompts]
    # a datastore that holds earlier answers to similar requests (here: the answers themselves)
    build_from_token_documents([list(t) for t in plain], tmp_path / "idx", smol_target.info.vocab_size,
                               smol_target.info.tokenizer_hash)
    proposer = RestProposer.open(tmp_path / "idx", smol_target.info.tokenizer_hash)
    drafted = 0
    for prompt, reference in zip(prompts, plain):
        decoder = SpeculativeDecoder(smol_target, [proposer], make_verifier("auto", [proposer.contract], config.policy), config)
        result = decoder.generate(prompt)
        assert result.tokens == reference
        drafted += sum(result.from_draft)
        # the ledger books the datastore lookup as retrieval, not as a proposal's drafting
        asked = [r for r in result.records if r.asked]
        assert all(r.seconds["retrieval"] > 0 and "propose" not in r.seconds for r in asked)
        assert result.stats.time_split["retrieval"] > 0 and result.stats.time_split["propose"] == 0
    assert drafted > 16
