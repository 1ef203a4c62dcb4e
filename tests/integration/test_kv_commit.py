"""KV commit: after many rounds whose trees hold rejected branches, the committed cache gives
the same next-token logits as a fresh prefill of the committed tokens (fp32, up to the rounding
of another kernel order: `assert_rows_close`)."""

import dataclasses

import numpy as np
import pytest

from draftwise.topology.compile import compile_round
from tests.helpers import assert_rows_close, path_to, result_from_paths

pytestmark = pytest.mark.model


def random_tree(rng, vocab, max_rows=10):
    paths = []
    for _ in range(int(rng.integers(1, 4))):
        paths.append([int(t) for t in rng.integers(0, vocab, size=int(rng.integers(1, 4)))])
    return result_from_paths(paths)


def fresh_logits(backend, tokens):
    backend.reset()
    backend.extend(tokens[:-1])
    logits = backend.verify(tokens[-1], None).logits[0].clone()
    backend.rollback()
    return logits


def test_commit_matches_fresh_prefill_after_50_tree_rounds(smol_target):
    backend = smol_target
    rng = np.random.default_rng(0)
    committed = backend.tokenize("The quick brown fox jumps over the lazy dog because")
    backend.reset()
    backend.extend(committed[:-1])
    rejected_rows = 0
    for _ in range(50):
        round_ = compile_round(len(committed), [random_tree(rng, 2000)])
        logits = backend.verify(committed[-1], round_)
        row = int(rng.integers(-1, round_.n))  # accept the path to a random node (-1: nothing)
        path = []
        while row != -1:
            path.append(row)
            row = int(round_.parent[row])
        path.reverse()
        rejected_rows += round_.n - len(path)
        backend.commit(path)
        bonus = int(logits.argmax()[len(path)])  # the accepted node's own prediction
        committed = committed + [int(round_.token_ids[r]) for r in path] + [bonus]
        assert backend.cached_len == len(committed) - 1
    assert rejected_rows > 50
    got = backend.verify(committed[-1], None).logits[0].clone()
    backend.rollback()
    want = fresh_logits(backend, committed)
    assert_rows_close(got, want)  # a fresh prefill reads the rows in one forward: fp32 rounding of another order


def test_rejected_rows_are_never_published(smol_target):
    backend = smol_target
    prompt = backend.tokenize("def add(a, b):\n    return")
    backend.reset()
    backend.extend(prompt[:-1])
    round_ = compile_round(len(prompt), [result_from_paths([[100, 200], [300]])])
    backend.verify(prompt[-1], round_)
    backend.commit([])  # everything rejected: only the pending row stays
    probe = backend.verify(50, None).logits[0].clone()
    backend.rollback()
    want = fresh_logits(backend, prompt + [50])
    assert_rows_close(probe, want)


def test_sibling_row_not_published(smol_target):
    backend = smol_target
    prompt = backend.tokenize("Once upon a time")
    backend.reset()
    backend.extend(prompt[:-1])
    round_ = compile_round(len(prompt), [result_from_paths([[100, 7], [300, 9]])])
    rows = {round_.path_tokens(i): i for i in range(round_.n)}
    backend.verify(prompt[-1], round_)
    backend.commit([rows[(300,)], rows[(300, 9)]])  # the second branch, out of row order
    probe = backend.verify(11, None).logits[0].clone()
    backend.rollback()
    want = fresh_logits(backend, prompt + [300, 9, 11])
    assert_rows_close(probe, want)


@pytest.mark.parametrize("paths", [None, [[100, 7, 8]], [[100, 7], [300, 9], [300, 4, 5]]], ids=["plain", "chain", "tree"])
def test_first_round_reads_the_prompt_in_the_verify_forward(smol_target, paths):
    """Round 1 passes the prompt as `unread` rows: every returned row equals a fresh prefill of
    its path, the prompt rows are committed whatever the round's outcome, and after a commit
    of a non-first branch the cache matches a fresh prefill."""
    backend = smol_target
    prompt = backend.tokenize("Once upon a time there was")
    backend.reset()
    round_ = None if paths is None else compile_round(len(prompt), [result_from_paths(paths)])
    got = backend.verify(prompt[-1], round_, unread=prompt[:-1]).logits.clone()  # [1+N, V]
    n = 0 if round_ is None else round_.n
    assert got.shape[0] == 1 + n and backend.cached_len == len(prompt) - 1
    backend.rollback()  # the pending row and the candidates go; the prompt rows stay
    assert backend.cached_len == len(prompt) - 1
    rows = [()] + [round_.path_tokens(r) for r in range(n)]
    wants = [fresh_logits(backend, prompt + list(path)) for path in rows]
    for row, want in enumerate(wants):
        assert_rows_close(got[row], want, f"row {row}")

    backend.reset()
    backend.verify(prompt[-1], round_, unread=prompt[:-1])
    # the path to the last row: in the tree, the last branch, not a prefix of the row order
    commit_and_probe(backend, prompt, round_, n - 1)


def commit_and_probe(backend, prompt, round_, row):
    """Commit the path to `row` of the provisional `round_`; the next logits must equal a fresh
    prefill of exactly the prompt and that path."""
    accepted = path_to(round_, row)
    backend.commit(accepted)
    committed = prompt + [int(round_.token_ids[r]) for r in accepted]
    assert backend.cached_len == len(committed)
    probe = backend.verify(11, None).logits[0].clone()
    backend.rollback()
    want = fresh_logits(backend, committed + [11])
    assert_rows_close(probe, want)


GROWTHS = {
    "plain": (None, [[100, 7], [300]]),
    "chain": ([[100, 7]], [[100, 7, 8], [100, 5], [300, 9]]),
    "tree": ([[100, 7], [300]], [[100, 7], [300], [100, 7, 8], [300, 9], [100, 5]]),
}


@pytest.mark.parametrize("start", sorted(GROWTHS))
def test_grown_round_rows_and_commit_match_fresh_prefill(smol_target, start):
    """verify_more appends rows to the provisional round (a draft tree's next level): each new
    row equals a fresh prefill of its path, and committing a path through new rows publishes
    exactly that path."""
    backend = smol_target
    prompt = backend.tokenize("Once upon a time there was")
    first_paths, all_paths = GROWTHS[start]
    first = None if first_paths is None else compile_round(len(prompt), [result_from_paths(first_paths)])
    grown = compile_round(len(prompt), [result_from_paths((first_paths or []) + all_paths)])
    have = 0 if first is None else first.n
    backend.reset()
    backend.extend(prompt[:-1])
    backend.verify(prompt[-1], first)
    got = backend.verify_more(grown, have).logits.clone()  # [N - have, V]
    assert got.shape[0] == grown.n - have
    assert backend.info.kv_row_bytes > 0  # every row is provisional or committed, none twice
    assert backend.kv_bytes() == (len(prompt) + grown.n) * backend.info.kv_row_bytes
    backend.rollback()
    assert backend.cached_len == len(prompt) - 1
    for i in range(grown.n - have):
        want = fresh_logits(backend, prompt + list(grown.path_tokens(have + i)))
        assert_rows_close(got[i], want, f"row {have + i}")

    backend.reset()
    backend.extend(prompt[:-1])
    backend.verify(prompt[-1], first)
    backend.verify_more(grown, have)
    commit_and_probe(backend, prompt, grown, grown.n - 1)  # a new row's path, not a prefix of the row order


def test_verify_more_refuses_a_round_that_does_not_extend_the_provisional_one(smol_target):
    from draftwise.backends.base import BackendError

    backend = smol_target
    prompt = backend.tokenize("def add(a, b):\n    return")
    backend.reset()
    backend.extend(prompt[:-1])
    first = compile_round(len(prompt), [result_from_paths([[100, 200]])])
    with pytest.raises(BackendError, match="without a provisional verify"):
        backend.verify_more(first, 0)
    backend.verify(prompt[-1], first)
    with pytest.raises(BackendError, match="begin with the provisional rows"):
        backend.verify_more(compile_round(len(prompt), [result_from_paths([[100, 201], [300]])]), 2)
    with pytest.raises(BackendError, match="prefix_len"):
        backend.verify_more(compile_round(len(prompt) + 1, [result_from_paths([[100, 200], [300]])]), 2)
    backend.rollback()
    assert backend.cached_len == len(prompt) - 1


def test_a_forward_that_fails_part_way_leaves_the_cache_as_it_was(smol_target):
    """A forward that raises after some layers appended their rows (out of memory, say) is cut
    back in every layer; the next rounds see exactly the committed prefix."""
    backend = smol_target
    prompt = backend.tokenize("Once upon a time there was")
    backend.reset()
    backend.extend(prompt[:-1])
    round_ = compile_round(len(prompt), [result_from_paths([[100, 7], [300]])])

    def fail(module, inputs, output):
        raise MemoryError("simulated: the forward died in layer 3")

    hook = backend.model.model.layers[3].register_forward_hook(fail)
    try:
        with pytest.raises(MemoryError):
            backend.verify(prompt[-1], round_)
    finally:
        hook.remove()
    assert backend.cached_len == len(prompt) - 1
    assert backend.kv_bytes() == (len(prompt) - 1) * backend.info.kv_row_bytes  # no layer kept a row
    got = backend.verify(prompt[-1], None).logits[0].clone()
    backend.rollback()
    want = fresh_logits(backend, prompt)
    assert_rows_close(got, want)


def test_commit_refuses_rows_that_are_not_one_path_and_verify_refuses_overflow(smol_target):
    from draftwise.backends.base import BackendError, ContextOverflow

    backend = smol_target
    prompt = backend.tokenize("def add(a, b):\n    return")
    backend.reset()
    backend.extend(prompt[:-1])
    round_ = compile_round(len(prompt), [result_from_paths([[100, 200], [300]])])  # rows 100, 200 (under 100), 300
    backend.verify(prompt[-1], round_)
    rows = {round_.path_tokens(r): r for r in range(round_.n)}
    with pytest.raises(BackendError, match="root-to-node path"):
        backend.commit([rows[(300,)], rows[(100, 200)]])  # 200 does not hang from 300
    with pytest.raises(BackendError, match="root-to-node path"):
        backend.commit([7])  # no such row
    backend.commit([rows[(100,)], rows[(100, 200)]])  # the refusals left the round committable
    assert backend.cached_len == len(prompt) + 2

    # a context of len(prompt) + 2 positions: the pending token and one candidate fit, two do not
    from draftwise.backends.transformers import TransformersBackend

    small = TransformersBackend(backend.model, backend.tokenizer,
                                dataclasses.replace(backend.info, context_length=len(prompt) + 2))
    small.extend(prompt[:-1])
    with pytest.raises(ContextOverflow, match="exceed the context"):
        small.verify(prompt[-1], compile_round(len(prompt), [result_from_paths([[9, 10, 11]])]))
    assert small.cached_len == len(prompt) - 1 and small.kv_bytes() == small.cached_len * small.info.kv_row_bytes
    small.verify(prompt[-1], compile_round(len(prompt), [result_from_paths([[9, 10]])]))  # 3 rows: the last position
