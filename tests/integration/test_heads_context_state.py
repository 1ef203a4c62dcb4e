"""The context layer's proposal-side state (the Hydra++ prefix layer, Clover's augmenting
block) follows the committed text exactly: after a generation with rejected rounds, and after
the context is truncated and continued differently, the next proposal and the layer's KV equal
those of a fresh run over the committed text; the layer's KV never holds a row the target did
not commit; and the proposal does depend on the earlier rows (so equality is not vacuous)."""

import numpy as np
import pytest
import torch

from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.heads import HeadsConfig, HeadsProposer
from draftwise.topology.compile import compile_round
from draftwise.topology.templates import cartesian
from draftwise.topology.tree_spec import TreeTemplate
from draftwise.verify.registry import make_verifier
from tests.helpers import assert_rows_close, result_from_paths, rows_close
from tests.integration.tiny_heads import random_headset
from tests.integration.tiny_models import V, tiny_backend

PROMPT = [1, 2, 3, 4]
CONFIG = HeadsConfig(tree=TreeTemplate(cartesian([2, 2])))  # top-k children: a deterministic proposal


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def proposal(proposer, context):
    result = proposer.propose(context, "m")
    return [(n.token, n.parent) for n in result.nodes]


def commit_text(target, context):
    """The target reads context[:-1] in one forward and commits it (context[-1] is the pending token)."""
    target.reset()
    target.verify(context[-2], None, unread=context[:-2])
    target.commit([])


def fresh(family, headset, context):
    """A new target and proposer that read the committed text context[:-1] in one forward."""
    target = tiny_backend(3)
    proposer = HeadsProposer(family, target, headset, CONFIG)
    commit_text(target, context)
    return proposer, proposal(proposer, context)


def same_state(a, b) -> bool:
    """The same rows up to fp32 rounding: a fresh run reads the text in other chunks."""
    return (a.prefix.kv.length == b.prefix.kv.length
            and rows_close(a.prefix.kv.keys, b.prefix.kv.keys)
            and rows_close(a.prefix.kv.values, b.prefix.kv.values)
            and rows_close(a.prefix.outputs, b.prefix.outputs))


@pytest.mark.parametrize("family", ["hydra++", "clover"])
def test_after_rejected_rounds_the_next_proposal_equals_a_fresh_run(family):
    target = tiny_backend(3)
    headset = random_headset(family, target, seed=7, num_heads=2, draft_vocab=6, layers=2, prefix=True)
    proposer = HeadsProposer(family, target, headset, CONFIG)
    config = GenerationConfig(max_new_tokens=12)
    result = SpeculativeDecoder(target, [proposer], make_verifier("greedy", [], config.policy), config).generate(PROMPT)
    rejected = [r for r in result.records[1:] if r.nodes and r.accepted < r.proposal_depth]
    assert rejected, "the test needs rounds whose drafts the target rejected"
    context = PROMPT + list(result.tokens)
    assert target.cached_len == len(context) - 1
    after = proposal(proposer, context)
    assert proposer.prefix.kv.length == target.cached_len  # committed rows only: no drafted row entered
    other, expected = fresh(family, headset, context)
    assert after and after == expected
    assert same_state(proposer, other)


@pytest.mark.parametrize("family", ["hydra++", "clover"])
def test_a_truncated_and_continued_context_is_cropped_then_extended(family):
    target = tiny_backend(3)
    headset = random_headset(family, target, seed=8, num_heads=2, draft_vocab=6, layers=2, prefix=True)
    proposer = HeadsProposer(family, target, headset, CONFIG)
    long = PROMPT + [5, 6, 7, 0, 1, 2]
    commit_text(target, long)
    before = proposal(proposer, long)
    # the same length, a different token at position 5: every row from 5 on must be recomputed
    other = long[:5] + [0, 6, 7, 0, 1, 2]
    target.truncate(5)
    target.extend(other[5:-1])
    got = proposal(proposer, other)
    fresh_proposer, expected = fresh(family, headset, other)
    assert got == expected and same_state(proposer, fresh_proposer)
    # the frontier output depends on the earlier rows: the stale state would have been caught
    assert not rows_close(proposer.prefix.outputs[-1], proposer_output(family, headset, long))
    assert before  # both contexts produced proposals


def proposer_output(family, headset, context):
    proposer, _ = fresh(family, headset, context)
    return proposer.prefix.outputs[-1]


def test_context_hidden_rows_are_the_committed_rows_states():
    """The backend's committed states equal a plain forward's final-norm rows, prompt included."""
    target = tiny_backend(3)
    target.track_context()
    target.reset()
    context = PROMPT + [5, 6]
    commit_text(target, context)
    rows = target.context_hidden(0)  # [cached_len, d]
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([context[:-1]]), output_hidden_states=True)
    assert rows.shape == (len(context) - 1, 16)
    assert_rows_close(rows, out.hidden_states[-1][0])
    assert np.array_equal(target.context_hidden(3), rows[3:])  # the same kept rows, read twice
    target.truncate(2)
    assert target.context_hidden(0).shape == (2, 16)
    target.track_context(False)
    assert target.context_hidden(0) is None


def test_context_rows_grown_round_by_round_past_the_buffer_equal_a_full_forward():
    """Rows committed a few at a time (the buffer doubles from 16 rows, twice here), truncated and
    continued: every committed row's state equals a plain forward's over the committed text."""
    target = tiny_backend(3)
    target.track_context()
    target.reset()
    rng = np.random.default_rng(0)
    text = [int(t) for t in rng.integers(0, V, size=60)]
    target.verify(text[4], None, unread=text[:4])
    target.commit([])
    position = 5  # text[:5] committed, text[5] pending
    while position < 50:
        chain = text[position + 1 : position + 4]
        round_ = result_round(position + 1, chain)
        target.verify(text[position], round_)
        target.commit([0, 1])  # two of the three candidates accepted
        position += 3
    def expected(length):
        with torch.inference_mode():
            out = target.model(input_ids=torch.tensor([text[:length]]), output_hidden_states=True)
        return out.hidden_states[-1][0].float().numpy()
    assert target.context_hidden(0).shape == (position, 16)
    assert_rows_close(target.context_hidden(0), expected(position))
    target.truncate(20)
    target.verify(text[20], None, unread=())
    target.commit([])
    assert_rows_close(target.context_hidden(0), expected(21))


def result_round(prefix_len, chain):
    return compile_round(prefix_len, [result_from_paths([chain])])
