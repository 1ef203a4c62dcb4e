"""Prompt lookup: copy what followed an earlier occurrence of the context's last n-gram.

Chain mode has the semantics of transformers' `prompt_lookup_num_tokens` /
`max_matching_ngram_size`: try n-gram sizes from the largest down to 1, take the EARLIEST
earlier occurrence of the suffix n-gram, and propose up to `num_tokens` tokens that followed
it.  Tree mode (`max_candidates` > 1) merges the continuations of the most recent distinct
occurrences into one trie.  Copied tokens carry no probability (semantics absent).
"""

from __future__ import annotations

from dataclasses import dataclass
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
from draftwise.proposers.family import CandidateShape, DrafterFamily
from draftwise.runtime.sampling import SamplingPolicy


@dataclass(frozen=True)
class PromptLookupConfig:
    # transformers' prompt_lookup_num_tokens
    num_tokens: int = option(10, key="lookup", help="tokens copied per continuation")
    # transformers' max_matching_ngram_size default
    max_ngram: int = option(2, key="ngram", help="longest suffix n-gram matched")
    max_candidates: int = option(1, key="candidates", help="> 1: a tree of that many continuations")

    def __post_init__(self) -> None:
        if self.num_tokens < 1 or self.max_ngram < 1 or self.max_candidates < 1:
            raise InputError(f"prompt lookup settings must be >= 1, got {self}")


def lookup_contract(config: PromptLookupConfig) -> ProposerContract:
    topology = TopologyKind.SEQUENCE if config.max_candidates == 1 else TopologyKind.TREE
    return ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, topology)


class PromptLookupProposer:
    name = "prompt-lookup"
    phase = "propose"
    # propose reads the context and the target's committed state only: a proposal never verified
    # leaves nothing to undo, so the guard may ask for one in a plain round (`draftwise.runtime.shadow`)
    proposes_without_state = True

    def __init__(self, config: PromptLookupConfig = PromptLookupConfig()) -> None:
        self.config = config
        self.contract = lookup_contract(config)

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, **self.config.__dict__}

    def begin(self, policy: SamplingPolicy, rng: np.random.Generator) -> None:
        pass  # stateless: the context is all it reads

    def observe(self, feedback: RoundFeedback) -> None:
        pass  # stateless: the next context already holds what was published

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        continuations = find_continuations(np.asarray(context, dtype=np.int64), self.config)
        nodes: list[ProposalNode] = []
        trie: dict[tuple[int, int], int] = {}
        for continuation in continuations:
            parent = -1
            for depth, token in enumerate(continuation, start=1):
                key = (parent, int(token))
                if key not in trie:
                    trie[key] = len(nodes)
                    nodes.append(ProposalNode(token=int(token), parent=parent, depth=depth, source=self.name))
                parent = trie[key]
        return ProposalResult(nodes=tuple(nodes), contract=self.contract, source=self.name, manifest_hash=manifest_hash)


def find_continuations(ids: np.ndarray, config: PromptLookupConfig) -> list[np.ndarray]:
    """Continuations [<= num_tokens] after occurrences of the longest matching suffix n-gram."""
    length = ids.shape[0]
    for n in range(min(config.max_ngram, length - 1), 0, -1):
        suffix = ids[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)  # [L - n, n]: excludes the suffix itself
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if starts.size == 0:
            continue
        if config.max_candidates == 1:
            chosen = starts[:1]  # transformers takes the earliest occurrence
        else:
            chosen = starts[::-1]  # most recent first
        found: list[np.ndarray] = []
        for start in chosen:
            continuation = ids[start + n : start + n + config.num_tokens]
            if continuation.size and not any(np.array_equal(continuation, f) for f in found):
                found.append(continuation)
            if len(found) == config.max_candidates:
                break
        if found:
            return found
    return []


FAMILY = DrafterFamily(
    name="prompt-lookup",
    config=PromptLookupConfig,
    contract=lookup_contract,
    shape=lambda c: CandidateShape(c.num_tokens * c.max_candidates, c.num_tokens, c.max_candidates > 1),
    build=lambda config, resources: PromptLookupProposer(config),
    summary="copy what followed an earlier occurrence of the context's last n-gram",
    free_to_ask=True,
    batched=True,
    auto_candidate=True,
    # width continuations of depth tokens (lookup is deterministic: the relation is its own)
    calibrated=lambda width, depth, relation: PromptLookupConfig(num_tokens=depth, max_candidates=width),
)
