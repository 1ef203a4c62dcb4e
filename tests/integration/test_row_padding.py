"""Verify forwards padded to a cheaper row count (`backends/row_padding.py`, measured by
`measure/row_padding.py`) compute what an unpadded forward computes: every verify's logits (chains, trees, a tree's next level, pending
only, hidden states) equal an unpadded twin's on the same weights, the cache holds no padding
row afterwards (the next calls still match, and a commit keeps the same length), and greedy
speculative decoding stays token-identical to plain decoding; in a batch the padded width
gives every slot what a lone unpadded backend gives it.

Planted faults these checks must catch: padding rows that real rows can see (a mask that
leaves their columns open), and padding rows' KV left in the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.backends import transformers_batch
from draftwise.backends.batch import Extend, GrowRound, VerifyCall
from draftwise.backends.row_padding import RowPadding
from draftwise.measure.row_padding import padded_rows
from draftwise.backends.transformers import TransformersBackend
from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.topology.compile import compile_round
from tests.helpers import make_spec, padding_columns_opened, path_to, result_from_paths
from draftwise.backends.transformers_batch import TransformersBatch
from tests.integration.test_batch_drafting import tree_levels
from tests.integration.test_transformers_batch import Mirror, assert_same, scenario, solo_of, start
from tests.integration.tiny_models import V, tiny_backend

# 2 and 3 rows slow, 4 fast; 6 and 7 slow, 8 fast: pads 2, 3 -> 4 and 6, 7 -> 8 (the AMD EPYC's shape)
PADDING = RowPadding((1.0, 2.2, 3.0, 1.6, 1.7, 2.5, 3.1, 1.8, 1.9, 2.0))


class Counted(TransformersBatch):
    """Slots that count their padded forwards."""

    padded = 0

    def _padded_width(self, sequences, width, past):
        padded = super()._padded_width(sequences, width, past)
        self.padded += padded > width
        return padded


def padded_twin(base: TransformersBackend, padding: RowPadding = PADDING, batch_type=Counted) -> TransformersBackend:
    twin = TransformersBackend(base.model, base.tokenizer, base.info, batch_type)
    twin.row_padding = padding
    return twin


def rows_hidden(backend: TransformersBackend):
    return backend.batch._slots[backend.slot].rows_hidden


def columns_needed(backend: TransformersBackend) -> int:
    return backend.batch._slots[backend.slot].end


def recording_batch() -> tuple[type[TransformersBatch], list[tuple[int, ...]]]:
    """A batch class that appends every forward's input shape [B', R] to the list returned with it."""
    shapes: list[tuple[int, ...]] = []

    class Recorded(TransformersBatch):
        def _model_call(self, ids, positions, mask, cache, keep, hidden):
            shapes.append(tuple(ids.shape))
            return super()._model_call(ids, positions, mask, cache, keep, hidden)

    return Recorded, shapes


def chain(prefix_len: int, tokens: list[int]):
    return compile_round(prefix_len, [result_from_paths([tokens[: i + 1] for i in range(len(tokens))])])


def tree(prefix_len: int, paths: list[list[int]]):
    return compile_round(prefix_len, [result_from_paths(paths)])


def test_the_padding_plan_used_here():
    assert [PADDING.rows_for(m) for m in range(1, 11)] == [1, 4, 4, 4, 5, 8, 8, 8, 9, 10]
    assert padded_rows(padded_twin(tiny_backend(0))) == {"2": 4, "3": 4, "6": 8, "7": 8}


def run_pair(padded: TransformersBackend, plain: TransformersBackend, track: bool = False) -> int:
    """The same calls on both backends; every logits (and hidden state) compared.  Returns the
    calls compared."""
    compared = 0
    for backend in (padded, plain):
        backend.track_hidden(track)
        backend.reset()
        backend.extend([1, 2, 3, 4, 5, 6, 7, 1, 2])

    def both(call):
        nonlocal compared
        got, want = call(padded), call(plain)
        assert_same(got, want, f"call {compared}")
        assert padded.batch.length == columns_needed(padded), "the padding rows' columns stayed in the cache"
        if track:
            assert torch.allclose(rows_hidden(padded), rows_hidden(plain), atol=1e-5)
        compared += 1

    t = plain.cached_len + 1
    both(lambda b: b.verify(3, chain(t, [4, 5])))  # 3 rows -> 4
    both(lambda b: b.commit([0]) or b.verify(6, None))  # pending only: 1 row, not padded
    for b in (padded, plain):
        b.rollback()
    t = plain.cached_len + 1
    first = tree(t, [[1], [2]])  # 3 rows -> 4, with a tree mask
    grown = tree(t, [[1], [2], [1, 3], [2, 4], [2, 5], [1, 6]])  # next level: 4 rows, not padded
    more = tree(t, [[1], [2], [1, 3], [2, 4], [2, 5], [1, 6], [1, 3, 7], [2, 4, 1]])  # 2 rows -> 4
    both(lambda b: b.verify(5, first))
    both(lambda b: b.verify_more(grown, first.n))
    both(lambda b: b.verify_more(more, grown.n))
    accepted = path_to(more, more.n - 2)
    for b in (padded, plain):
        b.commit(accepted)
    assert padded.cached_len == plain.cached_len
    t = plain.cached_len + 1
    both(lambda b: b.verify(2, chain(t, [3, 4, 5, 6, 7])))  # 6 rows -> 8
    for b in (padded, plain):
        b.commit([0, 1])
    both(lambda b: b.verify(1, chain(b.cached_len + 1, [2])))  # 2 rows -> 4, on the committed rows
    return compared


@pytest.mark.parametrize("track", [False, True], ids=["logits", "hidden-states"])
def test_a_padded_backend_computes_what_an_unpadded_one_does(track):
    base = tiny_backend(0)
    padded = padded_twin(base)
    assert run_pair(padded, solo_of(base), track) == 7
    assert padded.batch.padded == 5  # 3, 3, 2, 6 and 2 rows; the pending-only row and the level of 4 are not


def test_padding_rows_real_rows_can_see_are_caught(monkeypatch):
    """Planted fault: the padding rows' columns left open to the real rows of a tree."""
    monkeypatch.setattr(transformers_batch, "visible_rows", padding_columns_opened(transformers_batch.visible_rows))
    base = tiny_backend(0)
    with pytest.raises(AssertionError, match="logits differ|argmax"):
        run_pair(padded_twin(base), solo_of(base))


def test_padding_rows_left_in_the_cache_are_caught():
    base = tiny_backend(0)

    class Leaky(TransformersBatch):
        leak = False

        def _padded_width(self, sequences, width, past):
            padded = super()._padded_width(sequences, width, past)
            self.leak = padded > width
            return padded

        def _settle(self):
            if self.leak:  # the cut right after a padded forward is skipped
                self.leak = False
                return
            super()._settle()

    with pytest.raises(AssertionError, match="padding rows' columns"):
        run_pair(padded_twin(base, batch_type=Leaky), solo_of(base))


def test_greedy_speculation_with_padding_is_plain_decoding():
    base = tiny_backend(3)
    config = GenerationConfig(max_new_tokens=16)
    plain = build_decoder(make_spec(config), solo_of(base)).generate([1, 2, 3, 1, 2, 3, 1, 2])
    for options in (dict(proposer="prompt-lookup", lookup="3", guard="false"),
                    dict(proposer="prompt-lookup", lookup="6", guard="false")):
        padded = build_decoder(make_spec(config, **options), padded_twin(base)).generate([1, 2, 3, 1, 2, 3, 1, 2])
        assert padded.tokens == plain.tokens


# a batch's forwards are B' x R rows: here every count but multiples of 8 is slow, so the four
# slots' widths 5, 7, 9 run as 6, 8, 10
BATCH_PADDING = RowPadding(tuple((1 + 0.05 * m) * (1 if m == 1 or m % 8 == 0 else 2) for m in range(1, 41)))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_padded_batch_gives_every_slot_what_a_lone_unpadded_backend_gives(seed):
    Recorded, widths = recording_batch()
    mirror = scenario(Recorded, seed=seed, padding=BATCH_PADDING)
    assert mirror.checked > 30 and mirror.batch.row_padding is BATCH_PADDING
    assert all(slot.row_padding is None for slot in mirror.solo.values())
    padded, widths[:] = list(widths), []
    scenario(Recorded, seed=seed)  # the same calls unpadded
    widened = [(p, w) for p, w in zip(padded, widths) if p != w]
    assert widened and all(p[0] == w[0] and p[1] > w[1] and p[0] * p[1] % 8 == 0 for p, w in widened)


def test_no_padding_past_the_measured_counts_or_the_context():
    base = padded_twin(tiny_backend(0))
    slots = base.batch
    assert slots._padded_width(1, 11, 0) == 11  # 11 rows: past the 10 measured
    room = base.info.context_length
    assert slots._padded_width(1, 3, room - 3) == 3  # no room for the padding rows
    assert slots._padded_width(1, 3, room - 4) == 4
    slots.padded = 0
    base.extend([1, 2, 3])  # an extend reads one row out: not padded
    assert slots.padded == 0
    base.verify(4, chain(base.cached_len + 1, [5, 6]))
    assert slots.padded == 1


def test_a_batch_pads_by_its_models_plan_only_forwards_over_one_sequence():
    """A forward over one sequence (B = 1, or the last request left in a batch) is the single
    backend's forward, so the batch pads it by the model's plan; a forward over two sequences is
    never padded by it (that plan prices products alone: benchmarks/row_padding/).  Every verify
    equals a lone unpadded backend's, before and after the batch narrows to one slot."""
    Recorded, shapes = recording_batch()
    base = tiny_backend(0)
    batch = Recorded.from_backend(padded_twin(base), max_slots=2)
    assert batch.row_padding is None and batch.lone_padding is PADDING
    mirror = Mirror(batch, base)
    rng = np.random.default_rng(0)
    slots = start(mirror, rng, [4, 7])

    def call(slot: int, paths: list[list[int]]) -> VerifyCall:
        prefix_len = batch.cached_len(slot) + 1
        return VerifyCall(slot, int(rng.integers(0, V)), tree(prefix_len, paths))

    shapes.clear()
    calls = [call(slots[0], [[3, 4]]), call(slots[1], [[5, 6]])]  # 3 rows each: the plan pads 3 -> 4
    mirror.verify(calls)
    assert shapes == [(2, 3)]  # two sequences: unpadded
    for c in calls:
        mirror.settle(c.slot, path_to(c.round_, 0))
    mirror.close(slots[1])
    for paths, want in (([[3, 4]], (1, 4)), ([[1], [2]], (1, 4)), ([[1, 2, 3, 4]], (1, 5)), ([[6]], (1, 4))):
        shapes.clear()
        c = call(slots[0], paths)
        mirror.verify([c])
        assert shapes == [want], paths  # one sequence: 2, 3 -> 4 (a chain, a tree), 5 stays
        mirror.settle(slots[0], path_to(c.round_, c.round_.n - 1))
    mirror.check_next(slots[0])
    assert mirror.checked >= 8


def test_a_lone_slots_padded_draft_steps_equal_an_unpadded_backends():
    """A draft model's steps on a batch of one slot, its one-sequence forwards padded by the
    model's plan: a tree's first level (3 rows -> 4), its next levels (3 rows -> 4, then 1), a
    commit and an extend after it give what an unpadded lone backend gives, at the same length."""
    Recorded, shapes = recording_batch()
    base = tiny_backend(5)
    batch = Recorded.from_backend(padded_twin(base), 1)
    slot = batch.open()
    lone = solo_of(base)
    lone.reset()

    def run(call, want) -> None:
        [got] = batch.draft_many([call])
        assert_same(got, want, type(call).__name__)
        assert batch.cached_len(slot) == lone.cached_len

    run(Extend(slot, (1, 2, 3, 1, 2, 3, 4)), lone.extend([1, 2, 3, 1, 2, 3, 4]))
    batch.truncate(slot, batch.cached_len(slot) - 1)  # the last token becomes the pending one
    lone.truncate(lone.cached_len - 1)
    one, two, three = tree_levels(batch.cached_len(slot) + 1)
    shapes.clear()
    run(VerifyCall(slot, 7, one), lone.verify(7, one))
    run(GrowRound(slot, two, one.n), lone.verify_more(two, one.n))
    run(GrowRound(slot, three, two.n), lone.verify_more(three, two.n))
    assert shapes == [(1, 4), (1, 4), (1, 1)]
    accepted = path_to(three, three.n - 1)
    batch.commit(slot, accepted)
    lone.commit(accepted)
    run(Extend(slot, (6,)), lone.extend([6]))
    run(Extend(slot, (2, 5)), lone.extend([2, 5]))


def test_the_hidden_states_kept_are_the_rows_read_out():
    """The frontier after an extend (one row read out of several) and after a padded verify is
    the final norm's output of the model's own forward at that row.  (Planted in review: an
    index that took the first rows instead of the last read a prompt's first row.)"""
    base = padded_twin(tiny_backend(0))
    base.track_hidden(True)
    base.reset()
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    base.extend(tokens)
    with torch.inference_mode():
        own = base.model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]  # [9, d]
    assert np.allclose(base.frontier_hidden(), own[-1].numpy(), atol=1e-5)
    base.verify(3, chain(base.cached_len + 1, [4, 5]))  # 3 rows, padded to 4
    base.commit([0, 1])
    with torch.inference_mode():
        own = base.model(input_ids=torch.tensor([tokens + [3, 4, 5]]), output_hidden_states=True).hidden_states[-1][0]
    assert base.batch.padded == 1 and np.allclose(base.frontier_hidden(), own[-1].numpy(), atol=1e-5)
