"""The transformers backend's frontier hidden state (what draft heads read): after every way a
round can end (prefill by extend, a tree verify and a commit along a path that is not a prefix
of the row order, a verify grown by verify_more, a rejected round, a rollback) it is the
final-norm state of committed row cached_len - 1 as a fresh forward of the committed tokens
computes it, and the LM head on it reproduces that row's logits.  After a truncate or a reset
it is unknown (None), and without track_hidden it is never kept."""

import numpy as np
import pytest
import torch

from draftwise.topology.compile import compile_round
from tests.helpers import assert_rows_close, path_to, result_from_paths
from tests.integration.tiny_models import V, tiny_backend


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # a 2-layer model: threads cost more than they give (conftest restores)


def fresh(backend, tokens):
    """(hidden [T, d], logits [T, V]) of a fresh causal forward of `tokens`, no cache."""
    with torch.inference_mode():
        out = backend.model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    return out.hidden_states[-1][0], out.logits[0]


def check_frontier(backend, committed):
    """committed = every token so far, the pending one last (so the KV holds all but it)."""
    assert backend.cached_len == len(committed) - 1
    h = backend.frontier_hidden()
    assert h is not None and h.dtype == np.float32 and h.shape == (backend.model.config.hidden_size,)
    hidden, logits = fresh(backend, committed)
    row = backend.cached_len - 1
    assert_rows_close(h, hidden[row], "frontier state")  # a fresh forward reads the rows in another order
    lm_head = backend.model.get_output_embeddings().weight.detach()  # [V, d]
    assert_rows_close(lm_head @ torch.from_numpy(h), logits[row], "its logits")
    # that row predicted the pending token: heads continue from the same state the target did
    return logits[row]


def random_round(rng, prefix_len):
    paths = [[int(t) for t in rng.integers(0, V, size=int(rng.integers(1, 4)))] for _ in range(int(rng.integers(2, 5)))]
    return compile_round(prefix_len, [result_from_paths(paths)])


def test_frontier_hidden_after_tree_rounds_matches_a_fresh_forward():
    backend = tiny_backend(3)
    backend.track_hidden()
    rng = np.random.default_rng(0)
    committed = [1, 2, 3, 4, 5]
    backend.reset()
    assert backend.frontier_hidden() is None
    backend.extend(committed[:-1])  # a prefill by extend
    check_frontier(backend, committed)
    gathered = rejected = 0
    for r in range(12):
        round_ = random_round(rng, len(committed))
        logits = backend.verify(committed[-1], round_)
        # accept the path to a random node, or nothing every third round
        path = [] if r % 3 == 2 else path_to(round_, int(rng.integers(0, round_.n)))
        gathered += path != list(range(len(path)))
        rejected += not path
        backend.commit(path)
        bonus = int(logits.argmax()[path[-1] + 1 if path else 0])  # the last accepted row's own prediction
        committed = committed + [int(round_.token_ids[r]) for r in path] + [bonus]
        frontier_logits = check_frontier(backend, committed)
        assert int(frontier_logits.argmax()) == bonus
    assert gathered and rejected  # both commit paths ran


def test_frontier_hidden_after_the_prompt_is_read_in_the_verify_forward():
    """Round 1 of the engine: the prompt's rows go in as `unread` ahead of the pending token."""
    backend = tiny_backend(3)
    backend.track_hidden()
    backend.reset()
    prompt = [6, 1, 0, 2]
    round_ = compile_round(len(prompt), [result_from_paths([[3, 4], [5, 7, 1]])])
    backend.verify(prompt[-1], round_, unread=prompt[:-1])
    path = path_to(round_, round_.n - 1)  # [5, 7, 1]: rows 1, 3, 4, not a prefix of the row order
    assert path != list(range(len(path)))
    backend.commit(path)
    check_frontier(backend, prompt + [int(round_.token_ids[r]) for r in path] + [0])


def test_frontier_hidden_after_a_grown_round():
    backend = tiny_backend(3)
    backend.track_hidden()
    prompt = [1, 2, 3]
    first = compile_round(len(prompt), [result_from_paths([[4, 5], [6]])])
    grown = compile_round(len(prompt), [result_from_paths([[4, 5], [6], [6, 7, 2], [4, 1]])])
    backend.reset()
    backend.extend(prompt[:-1])
    backend.verify(prompt[-1], first)
    backend.verify_more(grown, first.n)
    path = path_to(grown, [r for r in range(grown.n) if grown.path_tokens(r) == (6, 7, 2)][0])
    assert max(path) >= first.n  # the path runs through rows verify_more added
    backend.commit(path)
    check_frontier(backend, prompt + [6, 7, 2] + [0])


def test_rollback_keeps_the_frontier_and_truncate_or_reset_forgets_it():
    backend = tiny_backend(3)
    backend.track_hidden()
    committed = [1, 2, 3, 4]
    backend.reset()
    backend.extend(committed[:-1])
    before = backend.frontier_hidden()
    backend.verify(committed[-1], compile_round(len(committed), [result_from_paths([[5, 6], [7]])]))
    backend.rollback()  # nothing published: the frontier is still committed row cached_len - 1
    assert np.array_equal(backend.frontier_hidden(), before)  # the kept state itself, untouched: exact
    check_frontier(backend, committed)
    backend.truncate(2)
    assert backend.frontier_hidden() is None
    backend.extend([3])
    check_frontier(backend, committed)
    backend.reset()
    assert backend.frontier_hidden() is None


def test_untracked_backend_keeps_no_hidden_state():
    backend = tiny_backend(3)
    backend.reset()
    backend.extend([1, 2, 3])
    backend.verify(4, compile_round(4, [result_from_paths([[5]])]))
    backend.commit([0])
    assert backend.frontier_hidden() is None


def test_token_weights_are_the_models_embedding_and_lm_head():
    backend = tiny_backend(3)
    weights = backend.token_weights()
    embed = backend.model.get_input_embeddings().weight.detach().numpy()
    lm_head = backend.model.get_output_embeddings().weight.detach().numpy()
    assert np.array_equal(weights.embed, embed) and np.array_equal(weights.lm_head, lm_head)
    assert not np.array_equal(weights.embed, weights.lm_head)  # untied here: the two must not be swapped


def test_a_generation_tracks_hidden_states_only_when_a_proposer_reads_them():
    """Tracking costs a plain step 3-5%: a plain decoder on a backend that a heads decoder used
    before must run untracked, and the heads decoder tracked again."""
    from draftwise.runtime.round import GenerationConfig
    from draftwise.runtime.decoder import SpeculativeDecoder
    from draftwise.proposers.heads import HeadsConfig, HeadsProposer
    from draftwise.verify.greedy import GreedyVerifier
    from tests.integration.tiny_heads import random_headset

    backend = tiny_backend(3)
    heads = SpeculativeDecoder(backend, [HeadsProposer("hydra", backend, random_headset("hydra", backend, seed=1),
                                                       HeadsConfig())], GreedyVerifier(), GenerationConfig(max_new_tokens=6))
    plain = SpeculativeDecoder(backend, [], GreedyVerifier(), GenerationConfig(max_new_tokens=6))
    heads.generate([1, 2, 3])
    assert backend.frontier_hidden() is not None
    plain.generate([1, 2, 3])
    assert backend.frontier_hidden() is None and not backend.batch._slots[backend.slot].track
    heads.generate([1, 2, 3])
    assert backend.batch._slots[backend.slot].track and backend.frontier_hidden() is not None
