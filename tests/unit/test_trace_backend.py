"""The trace backend: every row predicts the trace one-hot (rows off the trace too, never
reached), the unread prompt and the committed path are checked against the trace, and a
verifier that accepts a token the target would not produce is caught, not replayed."""

import numpy as np
import pytest

from draftwise.backends.base import BackendError
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.optimize.replay import Trace, replay
from draftwise.optimize.trace_backend import LeftTheTrace, TraceBackend
from draftwise.proposers.prompt_lookup import PromptLookupProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import TreeLimits, compile_round
from draftwise.verify.base import Selection, VerifierCapabilities
from draftwise.verify.greedy import GreedyVerifier
from tests.helpers import result_from_paths

PROMPT, TOKENS = (1, 2, 3), (4, 5, 6, 7)
# rows: 0 = 4 (d1), 1 = 5 (d2), 2 = 9 (d3), 3 = 6 under 4 (d2), 4 = 8 (d1), 5 = 6 under 8 (d2)
PATHS = [[4, 5, 9], [4, 6], [8, 6]]


def verified():
    backend = TraceBackend(PROMPT, TOKENS, context_length=32)
    round_ = compile_round(len(PROMPT), [result_from_paths(PATHS)])
    return backend, round_, backend.verify(PROMPT[-1], round_, unread=PROMPT[:-1])


def test_every_row_predicts_the_trace_token_after_it_at_its_depth():
    backend, round_, logits = verified()
    # pending (position 2) -> 4; depth 1 -> 5; depth 2 -> 6; depth 3 -> 7; rows off the trace
    # (6 under 4, 8, 6 under 8) get the trace token at their depth: never reached by a verifier
    assert logits.argmax().tolist() == [4, 5, 6, 7, 6, 5, 6]
    assert backend.cached_len == 2  # the unread prompt is committed, the pending row is not
    one_hot = logits.probs(0, SamplingPolicy(temperature=0.7, top_k=3))  # [V]: V = the largest trace id + 1
    assert one_hot.shape == (8,) and one_hot[4] == 1.0 and one_hot.sum() == 1.0
    selection = GreedyVerifier().select(round_, logits, SamplingPolicy(), np.random.default_rng(0))
    assert selection == Selection((0, 1), 6)  # 4, 5 accepted; 9 is not the trace's 6
    backend.commit(selection.accepted_rows)
    assert backend.cached_len == 5
    backend.rollback()  # nothing provisional: a no-op, as after any clean commit
    assert backend.cached_len == 5 and backend.kv_bytes() == 0


def test_tokens_off_the_trace_are_refused_wherever_the_engine_places_them():
    backend, _, _ = verified()
    with pytest.raises(LeftTheTrace, match="accepted candidates"):
        backend.commit([0, 3])  # 4 then 6, but the trace holds 5 after 4
    backend.rollback()
    with pytest.raises(LeftTheTrace, match="pending"):
        backend.verify(9, None)  # position 2 holds 3
    with pytest.raises(LeftTheTrace):
        TraceBackend(PROMPT, TOKENS, 32).verify(3, None, unread=[1, 5])
    with pytest.raises(BackendError, match="without a provisional verify"):
        TraceBackend(PROMPT, TOKENS, 32).commit([])


def test_extend_truncate_and_verify_more_keep_the_same_positions():
    backend = TraceBackend(PROMPT, TOKENS, context_length=32)
    assert backend.extend([1, 2]).argmax().tolist() == [3]
    backend.truncate(1)
    assert backend.cached_len == 1
    full = compile_round(3, [result_from_paths(PATHS)])
    first = compile_round(3, [result_from_paths([[4, 5]])])  # rows 0, 1 of `full`
    backend.extend([2])
    assert backend.verify(3, first).argmax().tolist() == [4, 5, 6]
    assert backend.verify_more(full, 2).argmax().tolist() == [7, 6, 5, 6]
    assert backend.tokenize(backend.detokenize([4, 5])) == [4, 5]


class AcceptsTheFirstChild:
    """A broken verifier: takes the first child at every node, whatever the target says."""

    capabilities = VerifierCapabilities(name="first-child", semantics=GreedyVerifier.capabilities.semantics,
                                        relations=GreedyVerifier.capabilities.relations,
                                        topologies=GreedyVerifier.capabilities.topologies, exact=True)

    def select(self, round_, target, policy, rng, draws=None):
        rows, row = [], -1
        while round_.children_of(row):
            row = round_.children_of(row)[0]
            rows.append(row)
        return Selection(tuple(rows), int(target.argmax()[row + 1]))


def test_a_verifier_accepting_a_token_the_target_would_not_produce_is_caught():
    prompt, tokens = (1, 2, 3, 4, 1, 2), (3, 9, 9, 9)  # prompt lookup offers [3, 4, 1, 2]: 4 is wrong
    proposer = PromptLookupProposer()
    decoder = SpeculativeDecoder(TraceBackend(prompt, tokens, 32), [proposer], AcceptsTheFirstChild(),
                                 GenerationConfig(max_new_tokens=4))
    with pytest.raises(LeftTheTrace):
        decoder.generate(list(prompt))
    # the honest verifier on the same backend publishes the trace itself
    decoder = SpeculativeDecoder(TraceBackend(prompt, tokens, 32), [proposer], GreedyVerifier(),
                                 GenerationConfig(max_new_tokens=4))
    assert decoder.generate(list(prompt)).tokens == tokens


def shape(rounds):
    return [(r.nodes, r.accepted, r.emitted, r.gated) for r in rounds]


def test_a_trace_cut_by_a_stop_string_ends_where_it_did_though_its_last_token_came_before():
    # prompt lookup on the replay tests' trace, cut after 3: that 3 also came 6 tokens earlier,
    # so it cannot be an EOS; the engine runs on past it and the rounds are cut there.
    # round 3 offers [2, 3, 4, 5]: 2, 3 are the trace's last, so 2 accepted and 2 emitted
    trace = Trace((1, 2, 3, 4, 5, 1, 2), (3, 4, 5, 9, 1, 2, 3), first_round_s=2.0, step_s=0.5)
    rounds = replay(trace, PromptLookupProposer(), max_new_tokens=10, limits=TreeLimits(), context_length=100)
    assert shape(rounds) == [(5, 3, 4, False), (0, 0, 1, False), (4, 2, 2, False)]


def test_sampling_replays_the_same_rounds_the_trace_being_the_target_sample():
    trace = Trace((1, 2, 3, 4, 5, 1, 2), (3, 4, 5, 9, 1, 2, 3, 8, 8, 8), first_round_s=2.0, step_s=0.5)

    def run(policy):
        return shape(replay(trace, PromptLookupProposer(), max_new_tokens=10, limits=TreeLimits(), context_length=100,
                            policy=policy, seed=3))

    assert run(SamplingPolicy(temperature=1.0)) == run(SamplingPolicy())


def hidden_backend(first=0):
    from draftwise.backends.base import BackendInfo, TokenWeights
    from draftwise.optimize.trace_backend import HiddenTraceBackend

    positions = len(PROMPT) + len(TOKENS)
    states = np.arange(positions - first, dtype=np.float32)[:, None] * np.ones((1, 3), dtype=np.float32)  # [R, 3]: row i = first + i
    states += first
    real = BackendInfo(name="transformers", checkpoint="ckpt@abc", tokenizer_hash="tok", vocab_size=50, context_length=64,
                       dtype="float32", device="cpu", eos_token_ids=frozenset())
    weights = TokenWeights(np.zeros((50, 3), np.float32), np.zeros((50, 3), np.float32))
    return HiddenTraceBackend(PROMPT, TOKENS, 32, frozenset(), target=real, hidden=states, first=first, weights=weights)


def test_the_hidden_trace_serves_the_state_of_every_committed_position_under_the_targets_identity():
    backend = hidden_backend()
    assert (backend.info.checkpoint, backend.info.tokenizer_hash, backend.info.vocab_size) == ("ckpt@abc", "tok", 50)
    assert backend.frontier_hidden() is None  # nothing committed yet
    backend.extend(list(PROMPT))
    assert backend.frontier_hidden().tolist() == [2.0] * 3  # the prompt's last row, which predicts the first new token
    assert backend.context_hidden(0)[:, 0].tolist() == [0.0, 1.0, 2.0]
    round_ = compile_round(len(PROMPT) + 1, [result_from_paths([[5, 6]])])
    backend.verify(4, round_)
    backend.commit([0, 1])  # 4 pending, 5 and 6 accepted: positions 3, 4, 5 committed
    assert backend.cached_len == 6 and backend.frontier_hidden().tolist() == [5.0] * 3
    assert backend.context_hidden(4)[:, 0].tolist() == [4.0, 5.0]
    backend.truncate(4)
    assert backend.frontier_hidden().tolist() == [3.0] * 3 and backend.context_hidden(0).shape == (4, 3)
    assert backend.context_hidden(5) is None  # past what is committed


def test_a_hidden_trace_that_starts_at_the_prompts_last_row_knows_nothing_before_it():
    backend = hidden_backend(first=len(PROMPT) - 1)
    backend.extend(list(PROMPT))
    assert backend.frontier_hidden().tolist() == [2.0] * 3
    assert backend.context_hidden(0) is None  # a context layer cannot be fed: rows 0, 1 unknown
    assert backend.context_hidden(2)[:, 0].tolist() == [2.0]


def test_hidden_states_that_do_not_cover_the_trace_are_refused():
    from draftwise.backends.base import TokenWeights
    from draftwise.optimize.trace_backend import HiddenTraceBackend

    short = np.zeros((len(PROMPT) + len(TOKENS) - 1, 3), np.float32)
    with pytest.raises(ValueError, match="do not cover"):
        HiddenTraceBackend(PROMPT, TOKENS, 32, frozenset(), target=hidden_backend().info, hidden=short, first=0,
                           weights=TokenWeights(short, short))
