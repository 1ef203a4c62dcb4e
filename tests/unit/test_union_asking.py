"""A union's gate asks a source that costs drafting time only where its rows would be verified
(`gate.SourceGate.ask`): the gate's rule on hand-built rounds, and the engine on a trace (a
source not asked proposes nothing, is told nothing, and the output is the target's own)."""

import time

import pytest

from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.runtime.gate import CostGateConfig, SourceGate, gate_round
from draftwise.optimize.trace_backend import TraceBackend
from draftwise.topology.compile import TreeLimits, compile_round
from draftwise.verify.greedy import GreedyVerifier
from tests.helpers import StubProposer, result_from_paths

STEP_S = 0.01  # a plain step's seconds in the profiles below


def costed(relative):
    """A profile with seconds: a source's drafting time is priced in plain steps."""
    return VerifyCostProfile.from_absolute(range(1, len(relative) + 1), [STEP_S * r for r in relative],
                                           model="m", backend="b", threads=2, machine="test")


PROFILE = costed([1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6])


def union_round(lookup_paths, heads_paths):
    return compile_round(10, [result_from_paths(lookup_paths, source="lookup"),
                              result_from_paths(heads_paths, source="heads")], TreeLimits())


def trained_gate(**options):
    """Lookup's chain 7, 8, 9 is always right; the heads propose its 7 (one merged row) and a wrong 1."""
    offered = union_round([[7, 8, 9]], [[7], [1]])
    g = SourceGate(CostGateConfig(PROFILE, **options), 2)
    for _ in range(12):
        assert g.start_round() in ([0, 1], [1, 0])
        g.drafted(0, 1e-7)  # lookup: free
        g.drafted(1, 3 * STEP_S)  # the heads: three plain steps
        gate_round(g, offered, reads_prompt=False)
        g.observe(offered, [7, 8, 9, 6])
    return g


def never_compiled():
    raise AssertionError("a free source is asked without weighing the round")


def test_a_costly_source_adds_nothing_to_lookups_rows_so_it_is_not_asked_until_its_patience_runs_out():
    g = trained_gate()
    assert g.draft_cost(1) == pytest.approx(3.0) and g.draft_cost(0) < SourceGate.FREE_DRAFTING
    assert g.start_round() == [0, 1]  # the cheaper source first
    assert g.ask(0, never_compiled)
    with_lookup = lambda: union_round([[7, 8, 9]], [])  # noqa: E731
    answers = [g.ask(1, with_lookup) for _ in range(SourceGate.ASK_PATIENCE + 1)]
    assert answers == [False] * SourceGate.ASK_PATIENCE + [True]  # the last one re-measures its worth
    assert g._patience[1] == 2 * SourceGate.ASK_PATIENCE  # still not worth it: it waits longer next time
    # the planted contrast: where lookup proposes nothing, the heads' 7 is all the round can commit
    assert g.ask(1, lambda: union_round([], []))
    assert g._patience[1] == SourceGate.ASK_PATIENCE
    assert trained_gate(ask_by_cost=False).ask(1, with_lookup)  # the rule off: always asked


class TraceCopier(StubProposer):
    """Proposes the trace's next `depth` tokens (a prompt lookup that always copies right), for free."""

    name = "copier"

    def __init__(self, tokens, prompt_len, depth):
        self.tokens, self.prompt_len, self.depth = tokens, prompt_len, depth

    def propose(self, context, manifest_hash, max_depth=None):
        start = len(context) - self.prompt_len
        ahead = list(self.tokens[start:start + self.depth])
        return result_from_paths([ahead] if ahead else [], source=self.name, manifest_hash=manifest_hash,
                                 contract=self.contract)


class SlowHeads(TraceCopier):
    """The trace's next token, after drafting for 2 ms (a fifth of a plain step); counts its calls."""

    name = "heads"

    def __init__(self, tokens, prompt_len):
        super().__init__(tokens, prompt_len, 1)
        self.proposed = self.observed = 0

    def propose(self, context, manifest_hash, max_depth=None):
        self.proposed += 1
        time.sleep(0.002)
        return super().propose(context, manifest_hash, max_depth)

    def observe(self, feedback):
        self.observed += 1


PROMPT, TOKENS = (1, 2, 3), tuple(10 + i % 50 for i in range(60))


def decode(copier_depth, **options):
    heads = SlowHeads(TOKENS, len(PROMPT))
    config = GenerationConfig(max_new_tokens=len(TOKENS), gate=CostGateConfig(PROFILE, **options))
    decoder = SpeculativeDecoder(TraceBackend(PROMPT, TOKENS, context_length=128),
                                 [TraceCopier(TOKENS, len(PROMPT), copier_depth), heads], GreedyVerifier(), config)
    result = decoder.generate(list(PROMPT))
    assert result.tokens == TOKENS
    return result, heads


def test_the_engine_skips_the_costly_source_where_the_free_one_has_it_covered():
    result, heads = decode(copier_depth=4)
    unasked = [r for r in result.records if r.unasked]
    assert unasked and all(r.unasked == ("heads",) for r in unasked)
    assert heads.proposed == heads.observed == len(result.records) - len(unasked)  # told only what it proposed
    always, always_heads = decode(copier_depth=4, ask_by_cost=False)
    assert not any(r.unasked for r in always.records) and always_heads.proposed == len(always.records)
    assert heads.proposed < always_heads.proposed / 2
    assert result.stats.by_source["heads"]["unasked"] == len(unasked)  # the ledger counts them
    assert result.stats.by_source["copier"]["unasked"] == 0
    # the contrast: a copier that never proposes leaves the heads' rows the only ones worth verifying
    alone, alone_heads = decode(copier_depth=0)
    assert not any(r.unasked for r in alone.records) and alone_heads.proposed == len(alone.records)
