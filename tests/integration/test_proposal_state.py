"""Proposal-side state follows the round: the draft model's cache, told what was accepted,
keeps exactly the committed text, and its next proposal equals a fresh run's."""

import numpy as np

from draftwise.runtime.contracts import ProposalResult
from draftwise.runtime.round import GenerationConfig, feedback_for
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.base import RoundFeedback
from draftwise.proposers.draft_model import DraftCacheMark, DraftConfig, DraftModelProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import compile_round
from draftwise.verify.registry import make_verifier
from tests.helpers import assert_probs_close
from tests.integration.tiny_models import PROMPT, tiny_backend

GREEDY = SamplingPolicy()


def chain_proposer(seed: int = 1) -> DraftModelProposer:
    draft = tiny_backend(seed)
    proposer = DraftModelProposer(draft, draft.info.tokenizer_hash, DraftConfig(k=4, confidence_threshold=0.0))
    proposer.begin(GREEDY, np.random.default_rng(0))
    return proposer


def test_after_a_rejection_the_draft_cache_holds_the_committed_text_and_proposes_as_a_fresh_run():
    proposer = chain_proposer()
    context = list(PROMPT)
    first = proposer.propose(context, "m")
    assert isinstance(first.state, DraftCacheMark) and first.state.fed_drafts == 3
    assert proposer.draft.cached_len == len(context) + 3  # the chain fed its drafts but the last
    # the verifier accepted one drafted token, then the target chose its own (not the second draft)
    bonus = (int(first.nodes[1].token) + 1) % 8
    proposer.observe(RoundFeedback(first, (0,), (int(first.nodes[0].token), bonus)))
    committed = context + [int(first.nodes[0].token), bonus]
    assert proposer.draft.cached_len == len(context) + 1  # rolled back to the accepted path
    again = proposer.propose(committed, "m")
    fresh = chain_proposer().propose(committed, "m")
    assert [n.token for n in again.nodes] == [n.token for n in fresh.nodes]
    for parent in again.distributions:
        assert_probs_close(again.distributions[parent], fresh.distributions[parent], f"q after {parent}")


def test_a_planted_stale_cache_is_caught_by_the_fresh_run_comparison():
    """Without the rollback (observe ignored) and without re-sync, the cache would keep the
    rejected drafts: the comparison above is what catches that."""
    proposer = chain_proposer()
    context = list(PROMPT)
    first = proposer.propose(context, "m")
    # no observe: the cache still holds three drafted tokens past the context
    assert proposer.draft.cached_len == len(context) + 3
    assert proposer._cached[len(context):] == [int(n.token) for n in first.nodes[:3]]


class Recording(DraftModelProposer):
    """The draft model, keeping every feedback it was given."""

    def begin(self, policy, rng) -> None:
        super().begin(policy, rng)
        self.told: list[RoundFeedback] = []

    def observe(self, feedback: RoundFeedback) -> None:
        self.told.append(feedback)
        super().observe(feedback)


def test_the_engine_hands_each_proposer_its_own_accepted_nodes_and_the_published_tokens():
    target, draft = tiny_backend(0), tiny_backend(0)  # draft == target: drafts are accepted
    proposer = Recording(draft, draft.info.tokenizer_hash, DraftConfig(k=4, confidence_threshold=0.0))
    result = SpeculativeDecoder(target, [proposer], make_verifier("auto", [proposer.contract], GREEDY),
                                GenerationConfig(max_new_tokens=10)).generate(PROMPT)
    assert len(proposer.told) == len(result.records)
    assert [t for f in proposer.told for t in f.published] == list(result.tokens)
    for feedback, record in zip(proposer.told, result.records):
        assert feedback.accepted == tuple(range(record.accepted))  # a chain: nodes 0, 1, ... in order
    assert sum(r.accepted for r in result.records) > 0


def test_feedback_maps_rows_back_to_each_results_own_nodes():
    a = ProposalResult(nodes=(), contract=chain_proposer().contract, source="x", manifest_hash="m")
    round_ = compile_round(len(PROMPT), [a])
    assert feedback_for(0, a, round_, (), (5,)).accepted == ()
