"""RestProposer: typed tree proposals, pruning, empty retrieval, tokenizer refusal, stats."""

from __future__ import annotations

import pytest

from draftwise.runtime.contracts import ProbabilitySemantics, SamplingRelation, TopologyKind
from draftwise.proposers.retrieval import RestProposer, TokenizerMismatch, build_from_token_documents
from draftwise.proposers.retrieval.index import RestIndex
from draftwise.proposers.retrieval.query import QueryConfig


@pytest.fixture
def index_dir(tmp_path):
    build_from_token_documents([[4, 5, 6, 9, 4, 5, 6, 10, 11]], tmp_path / "idx", vocab_size=12, tokenizer_hash="tok")
    return tmp_path / "idx"


def test_fixture_proposal(index_dir):
    proposer = RestProposer.open(index_dir, "tok")
    result = proposer.propose([1, 4, 5, 6], manifest_hash="m")
    assert proposer.contract.semantics is ProbabilitySemantics.FREQUENCY
    assert proposer.contract.relation is SamplingRelation.DETERMINISTIC_LOOKUP
    assert proposer.contract.topology is TopologyKind.TREE
    assert result.contract == proposer.contract and result.source == "rest" and result.manifest_hash == "m"
    assert [result.path(i) for i in range(len(result.nodes))] == [
        (9,), (10,), (9, 4), (10, 11), (9, 4, 5), (9, 4, 5, 6), (9, 4, 5, 6, 10), (9, 4, 5, 6, 10, 11)]
    assert all(n.q is None and n.score == 1.0 and n.source == "rest" for n in result.nodes)
    assert [n.depth for n in result.nodes[:2]] == [1, 1]


def test_max_nodes_prunes_and_empty_retrieval_proposes_nothing(index_dir):
    proposer = RestProposer(RestIndex.open(index_dir), max_nodes=3, target_tokenizer_hash="tok")
    assert [n.token for n in proposer.propose([4, 5, 6], "m").nodes] == [9, 10, 4]
    assert proposer.propose([7, 8], "m").nodes == ()
    assert proposer.propose([11], "m").nodes == ()  # shorter than min_suffix
    stats = proposer.stats()
    assert stats.calls == 3 and stats.misses == 2 and stats.miss_rate == pytest.approx(2 / 3)
    assert stats.mean_match_length == 3 and stats.mean_trie_nodes == pytest.approx(8 / 3)
    assert stats.mean_pruned_nodes == 1 and stats.p99_latency_ms >= stats.p50_latency_ms > 0


def test_the_depth_limit_applies_before_pruning_so_the_budget_goes_to_nodes_the_round_can_hold(tmp_path):
    # after 9 1 2: "3 4" three times, "5" and "7" once each
    documents = [[9, 1, 2, 3, 4]] * 3 + [[9, 1, 2, 5], [9, 1, 2, 7]]
    build_from_token_documents(documents, tmp_path / "idx", vocab_size=12, tokenizer_hash="tok")
    proposer = RestProposer(RestIndex.open(tmp_path / "idx"), max_nodes=3, target_tokenizer_hash="tok")
    unlimited = proposer.propose([9, 1, 2], "m")
    assert [n.depth for n in unlimited.nodes].count(2) == 1  # the frequent "3 4" keeps its second token
    shallow = proposer.propose([9, 1, 2], "m", max_depth=1)
    # pruning first would keep 3, 3-4 and one of 5/7, and the depth cut would leave only 2 nodes
    assert sorted(n.token for n in shallow.nodes) == [3, 5, 7] and {n.depth for n in shallow.nodes} == {1}
    assert proposer.propose([9, 1, 2], "m", max_depth=0).nodes == ()


def test_query_settings_default_to_the_index_and_can_be_overridden(index_dir):
    assert RestProposer.open(index_dir, "tok").query == QueryConfig()
    short = RestProposer.open(index_dir, "tok", query=QueryConfig(continuation_length=1))
    assert [n.token for n in short.propose([4, 5, 6], "m").nodes] == [9, 10]
    assert short.identity()["continuation_length"] == 1 and short.identity()["index_manifest"]


def test_other_tokenizer_is_refused(index_dir):
    with pytest.raises(TokenizerMismatch, match="Rebuild the index"):
        RestProposer.open(index_dir, "another-tokenizer")
    with pytest.raises(TokenizerMismatch):
        RestProposer(RestIndex.open(index_dir), target_tokenizer_hash="another-tokenizer")
