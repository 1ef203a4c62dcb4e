"""TransformersBatch: many slots in one forward give every slot what a lone backend gives it.

Each test drives a batch and, beside it, one fresh `TransformersBackend` per slot (the same
model object) doing the same verify/commit calls alone: the mirror.  Every call's logits must
equal the mirror's (within fp32 kernel-order rounding: `assert_rows_close`) and every slot's
length too.
Planted faults (a mask that shows a slot its padding, a commit applied to another slot's row,
a leave that forgets to renumber the rows so two slots share one, a closed slot's KV handed to
the next request) must make those checks fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.backends import transformers_batch
from draftwise.backends.base import BackendError, ContextOverflow
from draftwise.backends.batch import SlotView, VerifyCall
from draftwise.backends.transformers import TransformersBackend, kv_row_bytes
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.topology.compile import compile_round
from tests.helpers import assert_rows_close, padding_columns_opened, path_to, result_from_paths
from tests.integration.tiny_models import V, tiny_backend


def solo_of(base: TransformersBackend) -> TransformersBackend:
    """A fresh single backend on the same loaded model (its own cache)."""
    return TransformersBackend(base.model, base.tokenizer, base.info)


def assert_same(got, want, what: str) -> None:
    """A shared forward blocks its matmuls otherwise than a lone one: the same logits up to fp32
    rounding (so the same argmax wherever the top two are not within that rounding)."""
    assert_rows_close(got.logits, want.logits, f"{what}: logits")


class Mirror:
    """A batch and, per slot, a lone backend fed the same calls."""

    def __init__(self, batch: TransformersBatch, base: TransformersBackend) -> None:
        self.batch, self.base = batch, base
        self.solo: dict[int, TransformersBackend] = {}
        self.checked = 0  # calls compared

    def open(self) -> int:
        slot = self.batch.open()
        self.solo[slot] = solo_of(self.base)
        assert self.batch.cached_len(slot) == 0, f"slot {slot} reopened with {self.batch.cached_len(slot)} rows"
        return slot

    def close(self, slot: int) -> None:
        self.batch.close(slot)
        del self.solo[slot]

    def verify(self, calls: list[VerifyCall]) -> list:
        got = self.batch.verify_many(calls)
        assert len(got) == len(calls)
        for call, logits in zip(calls, got):
            want = self.solo[call.slot].verify(call.pending, call.round_, call.unread)
            assert_same(logits, want, f"slot {call.slot}")
            self.checked += 1
        return got

    def settle(self, slot: int, accepted: list[int] | None) -> None:
        """Commit `accepted` on the slot (None: roll back) in both."""
        if accepted is None:
            self.batch.rollback(slot)
            self.solo[slot].rollback()
        else:
            self.batch.commit(slot, accepted)
            self.solo[slot].commit(accepted)
        assert self.batch.cached_len(slot) == self.solo[slot].cached_len, f"slot {slot}: lengths differ"

    def check_next(self, slot: int, pending: int = 1) -> None:
        """The slot's next logits (pending only) equal its lone run's, then forgotten."""
        self.verify([VerifyCall(slot, pending, None)])
        self.settle(slot, None)


def random_round(rng: np.random.Generator, prefix_len: int, kind: str):
    """None (pending only), a chain or a tree over the tiny vocabulary."""
    if kind == "none":
        return None
    if kind == "chain":
        return compile_round(prefix_len, [result_from_paths([rng.integers(0, V, rng.integers(1, 5)).tolist()])])
    stem = rng.integers(0, V, 1).tolist()
    paths = [stem + rng.integers(0, V, rng.integers(0, 3)).tolist() for _ in range(3)]
    paths.append(rng.integers(0, V, 2).tolist())
    return compile_round(prefix_len, [result_from_paths(paths)])


def random_call(rng: np.random.Generator, slot: int, cached: int, unread: tuple[int, ...] = (),
                kind: str | None = None) -> VerifyCall:
    kind = kind or str(rng.choice(["none", "chain", "tree"]))
    return VerifyCall(slot, int(rng.integers(0, V)), random_round(rng, cached + len(unread) + 1, kind), unread)


def random_accept(rng: np.random.Generator, call: VerifyCall) -> list[int] | None:
    """Mostly a root-to-node path (ending anywhere, [] included), sometimes a rollback."""
    if rng.random() < 0.1:
        return None
    if call.round_ is None:
        return []
    return path_to(call.round_, int(rng.integers(-1, call.round_.n)))


def prompt(rng: np.random.Generator, n: int) -> tuple[tuple[int, ...], int]:
    tokens = rng.integers(0, V, n).tolist()
    return tuple(tokens[:-1]), tokens[-1]


def run_rounds(mirror: Mirror, rng: np.random.Generator, slots: list[int], rounds: int,
               kinds: tuple[str, ...] = ("none", "chain", "tree")) -> None:
    """`rounds` rounds in which every slot makes a call (shared forward), then commits its own path."""
    for _ in range(rounds):
        calls = [random_call(rng, s, mirror.batch.cached_len(s), kind=str(rng.choice(kinds))) for s in slots]
        mirror.verify(calls)
        for call in calls:
            mirror.settle(call.slot, random_accept(rng, call))


def start(mirror: Mirror, rng: np.random.Generator, lengths: list[int]) -> list[int]:
    """Open a slot per prompt length; read every prompt in one verify_many (one forward each)."""
    slots = [mirror.open() for _ in lengths]
    calls = []
    for slot, n in zip(slots, lengths):
        unread, pending = prompt(rng, n)
        calls.append(random_call(rng, slot, 0, unread))
    mirror.verify(calls)
    for call in calls:
        mirror.settle(call.slot, random_accept(rng, call))
    return slots


def scenario(batch_cls=TransformersBatch, seed: int = 0, padding=None) -> Mirror:
    """Four slots of different lengths: prompts, mixed rounds, a leave and a join into the freed id
    (`padding`: the batch's forwards padded by it; the lone backends never are)."""
    base = tiny_backend(seed)
    mirror = Mirror(batch_cls.from_backend(base, max_slots=4), base)
    mirror.batch.row_padding = padding
    rng = np.random.default_rng(seed)
    slots = start(mirror, rng, [3, 9, 5, 12])
    run_rounds(mirror, rng, slots, 3)
    mirror.close(slots[1])
    new = mirror.open()
    assert new == slots[1], "the freed id is reused"
    unread, pending = prompt(rng, 6)
    call = random_call(rng, new, 0, unread, kind="tree")
    decode = [random_call(rng, s, mirror.batch.cached_len(s)) for s in (slots[0], slots[2], slots[3])]
    mirror.verify([*decode, call])  # a join in the same verify_many as the decode rounds
    for c in [*decode, call]:
        mirror.settle(c.slot, random_accept(rng, c))
    run_rounds(mirror, rng, [slots[0], new, slots[2], slots[3]], 3)
    for slot in mirror.solo:
        mirror.check_next(slot)
    return mirror


# ---- exactness ---------------------------------------------------------------------------
def test_verify_many_matches_lone_backends_over_slots_of_different_lengths():
    for seed in (0, 1):
        mirror = scenario(seed=seed)
        assert mirror.checked > 30


def test_shares_the_model_and_reports_the_same_info():
    base = tiny_backend(0)
    batch = TransformersBatch.from_backend(base, max_slots=2)
    assert batch.model is base.model and batch.info is base.info and batch.max_slots == 2
    assert batch.n_threads == torch.get_num_threads()
    assert batch.tokenize("ab") == base.tokenize("ab") and batch.detokenize([1, 2]) == base.detokenize([1, 2])


def test_unread_rows_on_a_slot_with_history_and_pending_only_calls():
    base = tiny_backend(2)
    mirror = Mirror(TransformersBatch.from_backend(base, 3), base)
    rng = np.random.default_rng(2)
    slots = start(mirror, rng, [4, 7, 2])
    run_rounds(mirror, rng, slots, 2, kinds=("none",))
    # more context on a slot that has rows already, beside pending-only and tree calls of the others
    calls = [VerifyCall(slots[0], 3, None, (1, 2, 3, 4)),
             random_call(rng, slots[1], mirror.batch.cached_len(slots[1]), kind="none"),
             random_call(rng, slots[2], mirror.batch.cached_len(slots[2]), kind="tree")]
    mirror.verify(calls)
    for call in calls:
        mirror.settle(call.slot, random_accept(rng, call))
    run_rounds(mirror, rng, slots, 2)


def test_a_subset_of_slots_and_provisional_slots_left_alone():
    """Calls over few of the slots run on copied rows, most of them in place; a slot verified alone while
    another is still provisional (the engine's one-by-one retry) keeps both right."""
    base = tiny_backend(3)
    mirror = Mirror(TransformersBatch.from_backend(base, 4), base)
    rng = np.random.default_rng(3)
    slots = start(mirror, rng, [5, 8, 3, 10])
    run_rounds(mirror, rng, slots, 2)
    merges = []
    merge = mirror.batch._merge
    mirror.batch._merge = lambda *args: (merges.append(len(args[0])), merge(*args))[1]  # the copied-rows path
    for _ in range(3):
        calls = [random_call(rng, s, mirror.batch.cached_len(s)) for s in slots]
        for call in calls:  # one call at a time, each slot provisional until every slot has verified
            mirror.verify([call])
        for call in reversed(calls):
            mirror.settle(call.slot, random_accept(rng, call))
    # three slots share a forward in place while the fourth is still provisional
    first = [random_call(rng, slots[0], mirror.batch.cached_len(slots[0]), kind="tree")]
    mirror.verify(first)
    second = [random_call(rng, s, mirror.batch.cached_len(s)) for s in slots[1:]]
    mirror.verify(second)
    for call in [*second, *first]:
        mirror.settle(call.slot, random_accept(rng, call))
    for pair in ([slots[0], slots[3]], [slots[1], slots[2], slots[3]]):
        calls = [random_call(rng, s, mirror.batch.cached_len(s)) for s in pair]
        mirror.verify(calls)
        for call in calls:
            mirror.settle(call.slot, random_accept(rng, call))
    for slot in slots:
        mirror.check_next(slot)
    # lone calls and a pair of four slots ran on copied rows, three of four in place
    assert merges.count(1) == 12 + 1 + 4 and merges.count(2) == 1 and 3 not in merges, merges


def test_slot_view_is_a_single_sequence_backend():
    base = tiny_backend(4)
    batch = TransformersBatch.from_backend(base, 2)
    solo = solo_of(base)
    view = SlotView(batch, batch.open())
    other = SlotView(batch, batch.open())
    other.verify(5, None, (1, 2, 3))
    other.commit([])
    round_ = compile_round(4, [result_from_paths([[1, 2], [1, 3], [4]])])
    assert_same(view.verify(2, round_, (3, 3, 1)), solo.verify(2, round_, (3, 3, 1)), "view")
    view.commit([0, 2])
    solo.commit([0, 2])
    assert view.cached_len == solo.cached_len == 6
    assert_same(view.verify(0, None), solo.verify(0, None), "view after commit")
    view.truncate(4)
    solo.truncate(4)
    assert_same(view.verify(1, None), solo.verify(1, None), "view after truncate")


# ---- join, leave, memory --------------------------------------------------------------------
def test_leave_frees_the_row_and_a_join_starts_empty():
    base = tiny_backend(5)
    mirror = Mirror(TransformersBatch.from_backend(base, 3), base)
    rng = np.random.default_rng(5)
    slots = start(mirror, rng, [6, 11, 4])
    run_rounds(mirror, rng, slots, 2)
    batch = mirror.batch
    held = batch.kv_bytes()
    assert batch.kv_bytes(slots[1]) == batch.cached_len(slots[1]) * kv_row_bytes(base.model.config, torch.float32) > 0
    assert held >= sum(batch.kv_bytes(s) for s in slots)
    mirror.close(slots[1])
    assert batch.open_slots() == (slots[0], slots[2])
    assert batch.kv_bytes() < held, "closing a slot frees its batch row at once"
    with pytest.raises(BackendError, match="not open"):
        batch.cached_len(slots[1])
    again = mirror.open()
    assert again == slots[1] and batch.cached_len(again) == 0
    unread, pending = prompt(rng, 7)
    call = random_call(rng, again, 0, unread)
    mirror.verify([call])
    mirror.settle(again, random_accept(rng, call))
    run_rounds(mirror, rng, [slots[0], again, slots[2]], 3)
    with pytest.raises(BackendError, match="all 3 slots"):
        batch.open()
    for slot in (slots[2], slots[0]):
        mirror.close(slot)
    run_rounds(mirror, rng, [again], 2)
    mirror.check_next(again)


def test_refusals_name_the_slot_and_change_nothing():
    base = tiny_backend(6)
    batch = TransformersBatch.from_backend(base, 2)
    a, b = batch.open(), batch.open()
    with pytest.raises(BackendError, match="twice"):
        batch.verify_many([VerifyCall(a, 1, None), VerifyCall(a, 2, None)])
    with pytest.raises(BackendError, match="not open"):
        batch.verify_many([VerifyCall(7, 1, None)])
    with pytest.raises(BackendError, match="without a provisional"):
        batch.commit(a, [])
    batch.verify_many([VerifyCall(a, 1, None, (2, 3))])
    with pytest.raises(BackendError, match=f"slot {a}.*provisional"):
        batch.verify_many([VerifyCall(b, 1, None), VerifyCall(a, 1, None)])
    assert batch.cached_len(b) == 0
    with pytest.raises(BackendError, match="root-to-node"):
        batch.commit(a, [0])


# ---- overflow and failed forwards --------------------------------------------------------------
def test_context_overflow_names_the_slot_and_the_others_continue():
    base = tiny_backend(7)
    mirror = Mirror(TransformersBatch.from_backend(base, 3), base)
    rng = np.random.default_rng(7)
    slots = start(mirror, rng, [5, base.info.context_length - 3, 8])
    run_rounds(mirror, rng, [slots[0], slots[2]], 1)
    batch = mirror.batch
    long = slots[1]
    before = {s: batch.cached_len(s) for s in slots}
    held = batch.kv_bytes()
    big = compile_round(before[long] + 1, [result_from_paths([[1, 2, 3, 4]])])  # 5 rows: over the context
    calls = [random_call(rng, slots[0], before[slots[0]]), VerifyCall(long, 1, big),
             random_call(rng, slots[2], before[slots[2]])]
    with pytest.raises(ContextOverflow, match=f"slot {long}:"):
        batch.verify_many(calls)
    assert {s: batch.cached_len(s) for s in slots} == before and batch.kv_bytes() == held
    for s in slots:
        with pytest.raises(BackendError, match="without a provisional"):
            batch.commit(s, [])  # nothing went provisional
    run_rounds(mirror, rng, [slots[0], slots[2]], 3)  # the others continue identically
    mirror.verify([VerifyCall(long, 2, None)])  # and the long slot still takes what fits
    mirror.settle(long, [])
    for slot in slots:
        mirror.check_next(slot)


def test_a_forward_that_raises_leaves_every_slot_as_it_was():
    base = tiny_backend(8)
    mirror = Mirror(TransformersBatch.from_backend(base, 3), base)
    rng = np.random.default_rng(8)
    slots = start(mirror, rng, [4, 9])
    run_rounds(mirror, rng, slots, 2)
    third = mirror.open()
    batch = mirror.batch
    forwards = {"n": 0}

    def fail_second(module, args):  # the second layer of the second forward: the first forward succeeded
        forwards["n"] += 1
        if forwards["n"] == 2:
            raise RuntimeError("out of memory (planted)")

    before = ({s: batch.cached_len(s) for s in batch.open_slots()}, batch.length,
              [k.clone() for k in batch._keys])
    handle = base.model.model.layers[1].register_forward_pre_hook(fail_second)
    try:
        calls = [random_call(rng, s, batch.cached_len(s), kind="tree") for s in slots]
        calls.append(random_call(rng, third, 0, prompt(rng, 5)[0]))  # its own forward, second
        with pytest.raises(RuntimeError, match="planted"):
            batch.verify_many(calls)
    finally:
        handle.remove()
    assert ({s: batch.cached_len(s) for s in batch.open_slots()}, batch.length) == before[:2]
    assert all(torch.equal(k[:, :, : before[1]], old) for k, old in zip(batch._keys, before[2]))
    run_rounds(mirror, rng, slots, 1)
    unread, pending = prompt(rng, 5)
    call = random_call(rng, third, 0, unread)
    mirror.verify([call])
    mirror.settle(third, random_accept(rng, call))
    run_rounds(mirror, rng, [*slots, third], 2)


# ---- planted faults: each check above must catch them -----------------------------------------
class CommitsToAnotherSlot(TransformersBatch):
    """Fault: commit gathers the accepted rows in the row of the next open slot."""

    def commit(self, slot, accepted_rows):
        others = [s for s in self._slots if s != slot]
        if not others:
            return super().commit(slot, accepted_rows)
        a, b = self._slots[slot], self._slots[others[0]]
        a.row, b.row = b.row, a.row
        try:
            super().commit(slot, accepted_rows)
        finally:
            a.row, b.row = b.row, a.row


class ForgetsToRenumber(TransformersBatch):
    """Fault: a leave drops the batch row but leaves the later slots' row numbers as they were,
    so after the next join two slots share one row (each sees the other's KV)."""

    def close(self, slot):
        rows = {s: state.row for s, state in self._slots.items() if s != slot}
        super().close(slot)
        for s, row in rows.items():
            self._slots[s].row = min(row, len(self._slots))


class HandsOnClosedKV(TransformersBatch):
    """Fault: close keeps the slot's row and state, and the next open hands them to the new request."""

    def close(self, slot):
        self._stale = (slot, self._slots.pop(slot))

    def open(self):
        stale = getattr(self, "_stale", None)
        if stale is None:
            return super().open()
        self._stale = None
        self._slots[stale[0]] = stale[1]
        return stale[0]


def test_planted_commit_to_the_wrong_slot_is_caught():
    with pytest.raises(AssertionError):
        scenario(CommitsToAnotherSlot)


def test_planted_shared_row_after_a_leave_is_caught():
    with pytest.raises(AssertionError):
        scenario(ForgetsToRenumber)


def test_planted_reuse_of_a_closed_slots_kv_is_caught():
    with pytest.raises(AssertionError, match="reopened"):
        scenario(HandsOnClosedKV)


def test_planted_mask_showing_a_slot_its_padding_is_caught(monkeypatch):
    """Fault: a slot's rows see every past column of its batch row (padding, stale rows of
    rejected candidates, zeros of a longer neighbour's length) instead of its own prefix."""
    real = transformers_batch.visible_rows

    def leaky(entries, past, width):
        visible = real(entries, past, width)
        for j, (_, call) in enumerate(entries):
            if call is not None:
                visible[j, : call.rows, :past] = True
        return visible

    monkeypatch.setattr(transformers_batch, "visible_rows", leaky)
    with pytest.raises(AssertionError, match="logits differ"):
        scenario()


def test_planted_padding_rows_visible_to_a_short_call_are_caught(monkeypatch):
    """Fault: in the shared forward, the rows of a call shorter than the longest see the
    padding rows after them (token 0 at position 0: finite keys that are no part of the slot)."""
    monkeypatch.setattr(transformers_batch, "visible_rows", padding_columns_opened(transformers_batch.visible_rows))
    with pytest.raises(AssertionError, match="logits differ"):
        scenario()


# ---- the real model ----------------------------------------------------------------------------
@pytest.mark.model
def test_smollm_greedy_rounds_in_one_forward_match_lone_decoding(smol_target):
    """Three chat prompts of different lengths decoded greedily 16 tokens each, with chains that
    are partly right (the lone greedy answer with one token changed), all slots in one
    verify_many per round: the same tokens and the same logits as each prompt alone."""
    questions = ["What is 2 + 2?", "Name three colours of the rainbow, please, and say why they appear.", "Hi"]
    prompts = [smol_target.chat_prompt([{"role": "user", "content": q}]) for q in questions]
    new = 16
    plain = []
    for p in prompts:
        solo = solo_of(smol_target)
        solo.extend(p[:-1])
        out, pending = [], p[-1]
        for _ in range(new):
            pending = int(solo.verify(pending, None).argmax()[0])
            solo.commit([])
            out.append(pending)
        plain.append(out)
    mirror = Mirror(TransformersBatch.from_backend(smol_target, 4), smol_target)
    slots = [mirror.open() for _ in prompts]
    emitted: list[list[int]] = [[] for _ in prompts]
    rng = np.random.default_rng(0)
    while any(len(e) < new for e in emitted):
        calls, live = [], [i for i in range(len(prompts)) if len(emitted[i]) < new]
        for i in live:
            done, unread = emitted[i], () if emitted[i] else tuple(prompts[i][:-1])
            pending = done[-1] if done else prompts[i][-1]
            chain = list(plain[i][len(done) : len(done) + 3])
            if len(chain) > 1 and rng.random() < 0.6:
                chain[int(rng.integers(0, len(chain)))] = int(rng.integers(0, 1000))
            round_ = compile_round(mirror.batch.cached_len(slots[i]) + len(unread) + 1,
                                   [result_from_paths([chain])]) if chain else None
            calls.append(VerifyCall(slots[i], pending, round_, unread))
        got = mirror.verify(calls)
        for i, call, logits in zip(live, calls, got):
            best = logits.argmax()
            accepted: list[int] = []
            while call.round_ is not None and len(accepted) < call.round_.n \
                    and call.round_.token_ids[len(accepted)] == best[len(accepted)]:
                accepted.append(len(accepted))
            mirror.settle(slots[i], accepted)
            emitted[i].extend([int(call.round_.token_ids[r]) for r in accepted] + [int(best[len(accepted)])])
    assert [e[:new] for e in emitted] == plain
