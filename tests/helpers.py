"""Small builders shared by the tests (no mocks of anything a user would have for real)."""

from __future__ import annotations

from typing import Any, Sequence

from draftwise.runtime.contracts import (
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)

ABSENT_TREE = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)


def result_from_paths(paths: Sequence[Sequence[int]], source: str = "test", manifest_hash: str = "m",
                      contract: ProposerContract = ABSENT_TREE) -> ProposalResult:
    """A trie-shaped proposal (no probabilities) holding every given token path."""
    nodes: list[ProposalNode] = []
    index: dict[tuple[int, ...], int] = {}
    for path in paths:
        for depth in range(1, len(path) + 1):
            prefix = tuple(path[:depth])
            if prefix not in index:
                parent = -1 if depth == 1 else index[prefix[:-1]]
                index[prefix] = len(nodes)
                nodes.append(ProposalNode(token=prefix[-1], parent=parent, depth=depth, source=source))
    return ProposalResult(nodes=tuple(nodes), contract=contract, source=source, manifest_hash=manifest_hash)


class StubProposer:
    """The proposer role's bookkeeping for a test proposer: it learns nothing and keeps no state;
    a subclass writes `propose` (and sets `name`)."""

    name = "stub"
    phase = "propose"

    @property
    def contract(self) -> Any:
        from draftwise.proposers.prompt_lookup import PromptLookupProposer

        return PromptLookupProposer().contract  # deterministic lookup: any exact verifier takes it

    def identity(self) -> dict:
        return {"name": self.name}

    def begin(self, policy: Any, rng: Any) -> None:
        pass

    def observe(self, feedback: Any) -> None:
        pass


class ByteEncoder:
    """A tokenizer stand-in for index tests: UTF-8 bytes are the token ids."""

    name = "bytes"
    vocab_size = 256
    hash = "bytes-v1"

    def encode_batch(self, texts):
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def path_to(round_, row: int) -> list[int]:
    """The rows from the frontier down to `row`, root first ([] for -1): an accepted path."""
    rows: list[int] = []
    while row != -1:
        rows.insert(0, int(row))
        row = int(round_.parent[row])
    return rows


def make_spec(generation: Any = None, **options: Any) -> Any:
    """A DecoderSpec from the same KEY=VALUE options the CLI and the bench take."""
    from draftwise.spec import DecoderSpec
    from draftwise.parse import spec_from_options

    base = DecoderSpec() if generation is None else DecoderSpec(generation=generation)
    return spec_from_options({k: str(v) for k, v in options.items()}, base)
