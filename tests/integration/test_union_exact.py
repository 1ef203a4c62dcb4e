"""Heterogeneous rounds (`--proposer a+b`): the union of a sampled draft chain and prompt lookup
is exact at temperature 1 under the verifier negotiated for it (membership: chi-square on the
first two tokens' joint law of a tiny target), and a planted fault — the copied row tested with
the draft's q, i.e. a row whose q is taken from the wrong source — is caught by the same test.
The per-source ledger counts what each source proposed and got accepted."""

from dataclasses import replace

import numpy as np
import pytest

from draftwise.runtime.contracts import SamplingRelation
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.base import IncompatibleVerifier, bind
from draftwise.verify.membership import MembershipVerifier
from draftwise.verify.registry import make_verifier
from draftwise.verify.specinfer import SpecInferVerifier
from tests.integration.tiny_models import V, chi_square_p, exact_joint, tiny_backend

SAMPLES = 1000
POLICY = SamplingPolicy(temperature=1.0)
# "1 2" occurs earlier followed by "3 1 2 ...": prompt lookup copies a chain under the frontier,
# next to the draft's sampled chain
PROMPT = [1, 2, 3, 1, 2]


class WrongSourceQ(SpecInferVerifier):
    """Planted bug: every child of a node the draft drew at is tested with min(1, r/q) under the
    DRAFT's q, the copied (lookup) child included: its q is taken from the wrong source.  It
    claims membership's capabilities, so negotiation lets it verify the union."""

    capabilities = replace(MembershipVerifier.capabilities, name="wrong-source-q")

    def draws(self, round_, row):
        if row not in round_.q_dist[0]:
            return ()  # the draft drew nothing here: a plain target sample
        return round_.children_of(row)


def union(draft):
    return [DraftModelProposer(draft, "tiny", DraftConfig(k=2, confidence_threshold=0.0, relation=SamplingRelation.IID)),
            PromptLookupProposer(PromptLookupConfig(num_tokens=3, max_ngram=2))]


@pytest.fixture(scope="module")
def models():
    target = tiny_backend(3)
    return target, tiny_backend(4), exact_joint(target, POLICY, PROMPT)


def counts_of(target, draft, verifier) -> np.ndarray:
    counts = np.zeros((V, V))
    both = 0
    for seed in range(SAMPLES):
        config = GenerationConfig(max_new_tokens=2, policy=POLICY, seed=seed)
        result = SpeculativeDecoder(target, union(draft), verifier, config).generate(PROMPT)
        first = result.records[0]
        both += all(rows > 0 for _, rows, _ in first.by_source)
        counts[result.tokens[0], result.tokens[1]] += 1
    assert both == SAMPLES, "every first round must verify rows of both sources for the test to mean anything"
    return counts


def test_negotiation_gives_the_union_membership_and_refuses_residual_verifiers(models):
    target, draft, _ = models
    contracts = [p.contract for p in union(draft)]
    assert make_verifier("auto", contracts, POLICY).capabilities.name == "membership"
    assert make_verifier("auto", contracts, SamplingPolicy()).capabilities.name == "greedy"
    with pytest.raises(IncompatibleVerifier):
        bind(SpecInferVerifier(), contracts, POLICY)


def test_union_is_exact_at_temperature_one(models):
    target, draft, joint = models
    assert chi_square_p(counts_of(target, draft, MembershipVerifier()), joint) > 1e-3


def test_planted_wrong_source_q_is_caught(models):
    target, draft, joint = models
    assert chi_square_p(counts_of(target, draft, WrongSourceQ()), joint) < 1e-6


def test_ledger_counts_each_source(models):
    target, draft, _ = models
    config = GenerationConfig(max_new_tokens=12, policy=SamplingPolicy(), seed=0)
    result = SpeculativeDecoder(target, union(draft), MembershipVerifier(), config).generate(PROMPT)
    for record in result.records:
        if not record.asked:
            continue
        names = [name for name, _, _ in record.by_source]
        assert names == ["draft-model", "prompt-lookup"]
        for _, rows, accepted in record.by_source:
            assert 0 <= accepted <= min(rows, record.accepted)
        # every verified row came from some source, and an accepted row from at least one
        assert sum(rows for _, rows, _ in record.by_source) >= record.nodes
        assert max(accepted for _, _, accepted in record.by_source) <= record.accepted
        assert sum(accepted for _, _, accepted in record.by_source) >= record.accepted
    stats = result.stats.by_source
    assert set(stats) == {"draft-model", "prompt-lookup"}
    assert all(s["accepted"] <= s["rows"] for s in stats.values())
    assert stats["draft-model"]["rows"] > 0 and stats["prompt-lookup"]["rows"] > 0
