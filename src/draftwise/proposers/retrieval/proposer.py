"""REST: retrieval drafting from a datastore (He et al., 2023), as a typed tree proposal.

Each call finds the longest context suffix in the index, reads up to `max_matches`
continuations, merges them into a prefix-count trie and keeps the `max_nodes` best nodes.
The counts are corpus frequencies: they go into `score`, never into `q`, and the result
declares FREQUENCY semantics with DETERMINISTIC_LOOKUP sampling, so only verifiers that do
not need q (greedy match, target-sample membership) can be bound to it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from draftwise.runtime.contracts import (
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)
from draftwise.errors import InputError
from draftwise.options import option
from draftwise.proposers.base import RoundFeedback
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterResources
from draftwise.proposers.retrieval.index import RestIndex
from draftwise.proposers.retrieval.query import QueryConfig, retrieve
from draftwise.proposers.retrieval.trie import Trie, build_trie, prune

SOURCE = "rest"
CONTRACT = ProposerContract(ProbabilitySemantics.FREQUENCY, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)
DEFAULT_MAX_NODES = 32


@dataclass(frozen=True)
class RestStats:
    calls: int
    misses: int  # calls that proposed nothing (no match, or only empty continuations)
    miss_rate: float
    mean_match_length: float  # over calls with a match
    mean_latency_ms: float  # query + trie + prune
    p50_latency_ms: float
    p99_latency_ms: float
    mean_trie_nodes: float  # before pruning
    mean_pruned_nodes: float  # after pruning (what was proposed)


@dataclass
class _Tally:
    """Running counters of one proposer instance (never shared between instances)."""

    calls: int = 0
    misses: int = 0
    match_lengths: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    trie_nodes: list[int] = field(default_factory=list)
    kept_nodes: list[int] = field(default_factory=list)


class RestProposer:
    name = SOURCE
    contract = CONTRACT
    phase = "retrieval"  # suffix search, trie and pruning: the ledger's retrieval time
    # a lookup in a fixed datastore: a proposal never verified leaves nothing to undo, so the guard
    # may ask for one in a plain round (`draftwise.runtime.shadow`); its latency stats count it
    proposes_without_state = True

    def __init__(
        self,
        index: RestIndex,
        max_nodes: int = DEFAULT_MAX_NODES,
        query: QueryConfig | None = None,
        target_tokenizer_hash: str | None = None,
    ) -> None:
        if target_tokenizer_hash is not None:
            index.check_tokenizer(target_tokenizer_hash)
        if max_nodes < 1:
            raise InputError(f"max_nodes must be >= 1, got {max_nodes}")
        self.index = index
        self.max_nodes = max_nodes
        self.query = query or index.query_config  # the index's recorded defaults unless overridden
        self._tally = _Tally()

    @classmethod
    def open(cls, index_dir: Path | str, target_tokenizer_hash: str, verify: bool = True, **kwargs) -> "RestProposer":
        """Load and verify an index; refuse it if the target's tokenizer differs (TokenizerMismatch)."""
        return cls(RestIndex.open(Path(index_dir), verify=verify), target_tokenizer_hash=target_tokenizer_hash, **kwargs)

    # ---- the proposer role ---------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "index": str(self.index.directory), "index_manifest": self.index.manifest.hash,
                "tokenizer_hash": self.index.tokenizer_hash, "max_nodes": self.max_nodes, **asdict(self.query)}

    def begin(self, policy: Any = None, rng: np.random.Generator | None = None) -> None:
        pass  # deterministic lookup: no sampling state; stats accumulate across generations

    def observe(self, feedback: RoundFeedback) -> None:
        pass  # the trie's shape does not adapt to acceptance

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        """Tree of retrieved continuations of `context` (committed tokens; the last one is pending)."""
        started = time.perf_counter()
        trie, kept, match_length = self.draft_trie(context, max_depth)
        self._record(started, trie, kept, match_length)
        nodes = tuple(
            ProposalNode(token=int(t), parent=int(p), depth=int(d), score=float(c), source=SOURCE)
            for t, p, d, c in zip(kept.tokens, kept.parent, kept.depth, kept.count)
        )
        return ProposalResult(nodes=nodes, contract=CONTRACT, source=SOURCE, manifest_hash=manifest_hash)

    def draft_trie(self, context: Sequence[int], max_depth: int | None = None) -> tuple[Trie, Trie, int]:
        """(full trie, pruned trie, matched suffix length): the numbers behind a proposal.
        Continuations are cut to the round's depth limit before the trie is built and pruned:
        pruning first would spend the node budget on nodes the round then cannot hold."""
        match, rows = retrieve(self.index.arrays, context, self.query)  # rows: [K, L]
        if max_depth is not None:
            rows = rows[:, : max(max_depth, 0)]  # [K, min(L, max_depth)]
        trie = build_trie(rows)
        return trie, prune(trie, self.max_nodes), match.length

    # ---- statistics ----------------------------------------------------------------------
    def _record(self, started: float, trie: Trie, kept: Trie, match_length: int) -> None:
        tally = self._tally
        tally.calls += 1
        tally.latencies.append(time.perf_counter() - started)
        tally.trie_nodes.append(trie.size)
        tally.kept_nodes.append(kept.size)
        if kept.size == 0:
            tally.misses += 1
        if match_length:
            tally.match_lengths.append(match_length)

    def stats(self) -> RestStats:
        t = self._tally
        latencies = np.array(t.latencies) * 1e3 if t.latencies else np.zeros(1)
        return RestStats(
            calls=t.calls, misses=t.misses, miss_rate=t.misses / t.calls if t.calls else 0.0,
            mean_match_length=float(np.mean(t.match_lengths)) if t.match_lengths else 0.0,
            mean_latency_ms=float(latencies.mean()), p50_latency_ms=float(np.percentile(latencies, 50)),
            p99_latency_ms=float(np.percentile(latencies, 99)),
            mean_trie_nodes=float(np.mean(t.trie_nodes)) if t.trie_nodes else 0.0,
            mean_pruned_nodes=float(np.mean(t.kept_nodes)) if t.kept_nodes else 0.0,
        )


@dataclass(frozen=True)
class RestConfig:
    index: Path = option(key="index", parse=Path, help="REST datastore directory (`draftwise index build`)")
    max_nodes: int = option(DEFAULT_MAX_NODES, key="rest_nodes", help="nodes kept of the retrieved trie")


def _open(config: RestConfig, resources: DrafterResources) -> RestProposer:
    return RestProposer.open(config.index, resources.target.info.tokenizer_hash, max_nodes=config.max_nodes)


FAMILY = DrafterFamily(
    name=SOURCE,
    config=RestConfig,
    contract=lambda config: CONTRACT,
    # the tries vary with what is retrieved: the round's tree limits bound them
    shape=lambda config: CandidateShape(0, 0, True),
    build=_open,
    summary="continuations retrieved from a datastore, merged into a frequency trie",
    free_to_ask=True,
    auto_candidate=True,
)
