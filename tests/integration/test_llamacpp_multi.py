"""LlamaCppBatch on the embedded SmolLM2-135M GGUF: many slots in one llama_decode.

Reference for every check: the same tokens on a single-sequence `LlamaCppBackend` (same
weights, its own context).  Rows are not bit-identical to it: llama.cpp's CPU kernels sum in
an order that depends on the batch's row count, and a slot's cells sit elsewhere in the
unified cache than a lone sequence's (cells 0..t-1), with other slots' (masked) cells among
the keys.  `probe_batch_invariance` measures it (module fixture `tol`): on this model the
shared rows differ from the single backend's by up to ~1 logit (B = 2..8, pending-only and
chains), while a row that sees a wrong prefix moves by >= 3 (test_llamacpp_backend.py).  So
every row must lie within the probe's bound + SLACK, and its argmax must agree wherever the
reference's top-2 margin exceeds 2 * tol (everywhere when the probe found bit-identical rows).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.backends.base import BackendError, ContextOverflow  # noqa: E402
from draftwise.backends.batch import Extend, GrowRound, SlotView, VerifyCall  # noqa: E402
from draftwise.measure.invariance import probe_batch_invariance  # noqa: E402
from draftwise.backends.llamacpp import LlamaCppBackend, LlamaCppBatch  # noqa: E402
from draftwise.models import resolve  # noqa: E402
from tests.integration.test_llamacpp_backend import make_round  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]

SLOTS = 4
LEAVES = 4
SLOT_CTX = 160
SLACK = 0.75
BUG_FLOOR = 3.0  # the smallest move a wrong prefix makes (test_llamacpp_backend.py measured 3.1)


@pytest.fixture(scope="module")
def single():
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    b = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=1, n_ctx=SLOT_CTX, max_tree_leaves=LEAVES)
    yield b
    b.close()


@pytest.fixture(scope="module")
def batch(single):
    b = LlamaCppBatch.from_backend(single, max_slots=SLOTS, max_tree_leaves=LEAVES, slot_ctx=SLOT_CTX)
    yield b
    b.free()


@pytest.fixture(scope="module")
def probe(batch, single):
    return probe_batch_invariance(batch, single, slot_counts=(1, 3), candidates=(0, 3), prefix_len=16)


@pytest.fixture(scope="module")
def tol(probe):
    bound = max(c.vs_single for c in probe)
    assert bound + SLACK < BUG_FLOOR, f"kernel noise {bound:.3g} too large to tell a bug from rounding"
    return bound + SLACK


@pytest.fixture(scope="module")
def exact(probe):
    return all(c.vs_single == 0.0 for c in probe)


@pytest.fixture
def clean(batch):
    yield batch
    for slot in batch.open_slots():
        batch.close(slot)


def tokens(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(100, 20000, n)]


def single_rows(single: LlamaCppBackend, committed: list[int], pending: int, round_=None, unread=()) -> np.ndarray:
    """[1+N, V] of the same verify on the single backend (reset before and after)."""
    single.reset()
    if committed:
        single.extend(committed)
    rows = np.array(single.verify(pending, round_, list(unread)).logits, dtype=np.float64)
    single.reset()
    return rows


def assert_close(got, want: np.ndarray, tol: float, exact: bool, what: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = float(np.max(np.abs(got - want)))
    assert diff <= tol, f"{what}: max |diff| {diff:.3g} > {tol:.3g}"
    for r in range(want.shape[0]):
        top2 = np.sort(want[r])[-2:]
        if exact or top2[1] - top2[0] > 2 * tol:
            assert int(np.argmax(got[r])) == int(np.argmax(want[r])), f"{what} row {r}: argmax differs"


def assert_slot_holds(batch: LlamaCppBatch, slot: int, length: int) -> None:
    """The isolation/reuse check: the slot's sequence ids are its own (no other open slot shares
    one), its main sequence holds exactly positions [0, length) and its leaf sequences nothing."""
    mine = set(batch.seq_ids(slot))
    for other in batch.open_slots():
        if other != slot:
            assert not mine & set(batch.seq_ids(other)), f"slots {slot} and {other} share sequence ids"
    main, *leaves = batch.seq_ids(slot)
    mem = batch._mem
    assert llama_cpp.llama_memory_seq_pos_min(mem, main) == (0 if length else -1), f"slot {slot}: main sequence start"
    assert llama_cpp.llama_memory_seq_pos_max(mem, main) == length - 1, \
        f"slot {slot}: main sequence ends at {llama_cpp.llama_memory_seq_pos_max(mem, main)}, not {length - 1}"
    for seq in leaves:
        assert llama_cpp.llama_memory_seq_pos_max(mem, seq) == -1, f"slot {slot}: leaf sequence {seq} holds cells"
    assert batch.cached_len(slot) == length


def test_verify_many_matches_single(clean, single, tol, exact):
    batch = clean
    a, b, c, d = (batch.open() for _ in range(SLOTS))
    pa, pb, pc, pd = tokens(1, 41), tokens(2, 26), tokens(3, 34), tokens(4, 19)
    for slot, prefix in ((a, pa), (b, pb), (c, pc)):  # committed prefixes of different lengths
        batch.verify_many([VerifyCall(slot, prefix[-1], None, tuple(prefix[:-1]))])
        batch.commit(slot, ())
    ta, tb = tokens(5, 4), tokens(6, 10)
    chain = make_round(len(pa) + 1, [(ta[i], i - 1) for i in range(4)])
    # depth 3 with siblings: 4 leaves
    tree = make_round(len(pb) + 1, [(tb[0], -1), (tb[1], -1), (tb[2], 0), (tb[3], 0), (tb[4], 1),
                                    (tb[5], 2), (tb[6], 4)])
    small_tree = make_round(len(pd), [(tb[7], -1), (tb[8], -1), (tb[9], 0)])  # after a prompt read
    calls = [VerifyCall(a, 901, chain), VerifyCall(b, 902, tree), VerifyCall(c, 903, None),
             VerifyCall(d, pd[-1], small_tree, tuple(pd[:-1]))]
    got = [np.array(x.logits) for x in batch.verify_many(calls)]
    assert [g.shape[0] for g in got] == [5, 8, 1, 4]
    assert batch.cached_len(d) == len(pd) - 1  # the prompt is committed, the round provisional
    assert batch.kv_bytes() == (len(pa) + 5 + len(pb) + 8 + len(pc) + 1 + len(pd) - 1 + 4) * batch.geometry.bytes_per_cell
    assert_close(got[0], single_rows(single, pa, 901, chain), tol, exact, "chain slot")
    assert_close(got[1], single_rows(single, pb, 902, tree), tol, exact, "tree slot")
    assert_close(got[2], single_rows(single, pc, 903), tol, exact, "pending-only slot")
    assert_close(got[3], single_rows(single, [], pd[-1], small_tree, pd[:-1]), tol, exact, "prompt + tree slot")

    # per slot: commit a chain prefix, a tree path to an inner node, roll one back, commit the pending token
    batch.commit(a, [0, 1])
    batch.commit(b, [0, 2])
    batch.rollback(c)
    batch.commit(d, [1])
    text = {a: pa + [901, ta[0], ta[1]], b: pb + [902, tb[0], tb[2]], c: pc, d: pd + [tb[8]]}
    for slot in (a, b, c, d):
        assert_slot_holds(batch, slot, len(text[slot]))
    # the next round of every slot sees exactly its committed text (checked against a fresh run)
    nxt = {a: 11, b: 12, c: 13, d: 14}
    got = batch.verify_many([VerifyCall(s, nxt[s], None) for s in (a, b, c, d)])
    for slot, logits in zip((a, b, c, d), got):
        assert_close(np.array(logits.logits), single_rows(single, text[slot], nxt[slot]), tol, exact, f"slot {slot} next")
    for slot in (a, b, c, d):
        batch.rollback(slot)
        assert_slot_holds(batch, slot, len(text[slot]))


def test_join_leave_reuse(clean, single, tol, exact):
    batch = clean
    s0, s1, s2 = batch.open(), batch.open(), batch.open()
    old = tokens(10, 60)  # the request that leaves: longer than the one that takes its slot
    for slot, prefix in ((s0, tokens(11, 20)), (s1, old), (s2, tokens(12, 30))):
        batch.verify_many([VerifyCall(slot, prefix[-1], None, tuple(prefix[:-1]))])
        batch.commit(slot, ())
    tree = make_round(len(old) + 1, [(500, -1), (501, -1), (502, 0)])
    batch.verify_many([VerifyCall(s1, 7, tree), VerifyCall(s0, 8, None)])  # s1 leaves mid-round
    batch.close(s1)
    assert s1 not in batch.open_slots()
    assert batch.kv_bytes() == (20 + 1 + 30) * batch.geometry.bytes_per_cell
    new = batch.open()
    assert new == s1  # the lowest free id: reused
    assert_slot_holds(batch, new, 0)
    prompt = tokens(13, 12)
    got = batch.verify_many([VerifyCall(new, prompt[-1], None, tuple(prompt[:-1])), VerifyCall(s2, 9, None)])
    assert_close(np.array(got[0].logits), single_rows(single, [], prompt[-1], None, prompt[:-1]), tol, exact,
                 "reused slot")
    batch.rollback(s0)
    batch.commit(new, ())
    batch.rollback(s2)
    assert_slot_holds(batch, new, len(prompt))
    assert_slot_holds(batch, s0, 20)
    # a slot as a single-sequence Backend
    view = SlotView(batch, s2)
    row = np.array(view.verify(21, None).logits)
    view.commit(())
    assert view.cached_len == 31
    assert_close(row, single_rows(single, tokens(12, 30), 21), tol, exact, "slot view")
    view.truncate(25)
    assert_slot_holds(batch, s2, 25)


def test_overflow_refused_per_slot(clean):
    batch = clean
    s0, s1 = batch.open(), batch.open()
    batch.verify_many([VerifyCall(s0, 5, None, tuple(tokens(20, 30)))])
    batch.commit(s0, ())
    with pytest.raises(ContextOverflow, match=f"slot {s1}"):
        batch.verify_many([VerifyCall(s0, 6, None), VerifyCall(s1, 7, None, tuple(tokens(21, SLOT_CTX)))])
    assert_slot_holds(batch, s0, 31)  # the other slot untouched, nothing decoded
    assert_slot_holds(batch, s1, 0)
    big_tree = make_round(32, [(100 + i, -1) for i in range(LEAVES + 1)])
    with pytest.raises(BackendError, match="leaves"):
        batch.verify_many([VerifyCall(s0, 6, big_tree)])
    with pytest.raises(BackendError, match="twice"):
        batch.verify_many([VerifyCall(s0, 6, None), VerifyCall(s0, 6, None)])
    batch.verify_many([VerifyCall(s0, 6, None)])
    with pytest.raises(BackendError, match="provisional"):
        batch.verify_many([VerifyCall(s0, 6, None)])
    batch.rollback(s0)
    assert_slot_holds(batch, s0, 31)


def test_failed_decode_leaves_every_slot(clean, monkeypatch):
    batch = clean
    s0, s1 = batch.open(), batch.open()
    batch.verify_many([VerifyCall(s0, 5, None, tuple(tokens(30, 20)))])
    batch.commit(s0, ())
    tree = make_round(22, [(100, -1), (101, -1)])
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, b: 1)
    with pytest.raises(BackendError, match="llama_decode failed"):
        batch.verify_many([VerifyCall(s0, 6, tree), VerifyCall(s1, 7, None, tuple(tokens(31, 10)))])
    monkeypatch.undo()
    assert_slot_holds(batch, s0, 21)
    assert_slot_holds(batch, s1, 0)


class _SharedIds(LlamaCppBatch):
    """Planted fault: every slot gets the first slot's sequence ids."""

    def _seq_base(self, slot: int) -> int:
        return 0


class _NoClear(LlamaCppBatch):
    """Planted fault: a closed slot's cells stay."""

    def _clear(self, slot: int) -> None:
        pass


@pytest.mark.parametrize("faulty", [_SharedIds, _NoClear])
def test_planted_faults_are_caught(single, faulty):
    batch = faulty.from_backend(single, max_slots=2, max_tree_leaves=1, slot_ctx=64)
    try:
        s0 = batch.open()
        batch.verify_many([VerifyCall(s0, 5, None, tuple(tokens(40, 20)))])
        batch.commit(s0, ())
        if faulty is _NoClear:
            batch.close(s0)
        s1 = batch.open()
        with pytest.raises(AssertionError):
            assert_slot_holds(batch, s1, 0)
        # and llama.cpp refuses the leak itself: a sequence's positions must follow its last cell
        with pytest.raises(BackendError):
            batch.verify_many([VerifyCall(s1, 6, None, tuple(tokens(41, 8)))])
    finally:
        batch.free()


def test_long_prompts_split_decodes(tol, exact, monkeypatch):
    """Rows past one llama_decode (512): whole calls go to several decodes, and a prompt longer
    than one decode is read first in its own; every call's rows still match the single backend."""
    model = resolve("smollm2-135m")
    single = LlamaCppBackend.load(model, n_threads=1, n_ctx=520)
    batch = LlamaCppBatch.from_backend(single, max_slots=3, max_tree_leaves=1, slot_ctx=520)
    try:
        a, b, c = batch.open(), batch.open(), batch.open()
        prompts = {a: tokens(50, 514), b: tokens(51, 41), c: tokens(52, 473)}
        decodes = []
        real = llama_cpp.llama_decode
        monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, bt: decodes.append(bt.n_tokens) or real(ctx, bt))
        got = batch.verify_many([VerifyCall(s, p[-1], None, tuple(p[:-1])) for s, p in prompts.items()])
        monkeypatch.undo()
        assert decodes == [512, 1, 42, 473]  # a's prompt alone, then a's pending row + b, then c
        for (slot, prompt), logits in zip(prompts.items(), got):
            assert_close(np.array(logits.logits), single_rows(single, [], prompt[-1], None, prompt[:-1]), tol, exact,
                         f"slot {slot}")
            batch.commit(slot, ())
            assert_slot_holds(batch, slot, len(prompt))
    finally:
        batch.free()
        single.close()


# ---- a draft model's steps for many slots (`draft_many`) -----------------------------------------
class _SiblingAncestors(LlamaCppBatch):
    """Planted fault: a new leaf's sequence takes its provisional ancestors from a sibling's path
    (another leaf's sequence, up to the same position), so its rows see the sibling's token."""

    def _give_ancestors(self, slot, copies):
        leaves = sorted(set(self._state(slot).seq_end) - {0})
        crossed = [(next((s for s in leaves if s != source), source) if source else source, seq, end)
                   for source, seq, end in copies]
        assert not copies or crossed != list(copies), "the scenario must grow a leaf from another leaf's path"
        super()._give_ancestors(slot, crossed)


def draft_many_scenario(single: LlamaCppBackend, batch: LlamaCppBatch, tol: float, exact: bool) -> int:
    """Slots of different lengths through extends (one token, a few, a prompt longer than one
    llama.cpp batch), a tree's first level beside extends, its next levels grown beside extends,
    a commit into the tree, a leave and a join; every call's logits within the kernels' noise of
    the same call on a lone backend holding that slot's text.  Returns the calls compared."""
    text: dict[int, list[int]] = {}
    tree: dict[int, list] = {}  # slot -> [(pending, first round)], then [(grown round, first_row)]

    def lone(call) -> np.ndarray:
        single.reset()
        if text[call.slot]:
            single.extend(text[call.slot])
        if isinstance(call, Extend):
            got = single.extend(list(call.tokens))
        elif isinstance(call, VerifyCall):
            got = single.verify(call.pending, call.round_)
        else:
            (pending, first), *levels = tree[call.slot]
            single.verify(pending, first)
            for round_, first_row in levels:
                single.verify_more(round_, first_row)
            got = single.verify_more(call.round_, call.first_row)
        rows = np.array(got.logits, dtype=np.float64)
        single.reset()
        return rows

    checked = 0

    def run(calls) -> None:
        nonlocal checked
        want = [lone(call) for call in calls]
        for call, got, rows in zip(calls, batch.draft_many(calls), want):
            assert_close(got.logits, rows, tol, exact, f"{type(call).__name__} on slot {call.slot}")
            if isinstance(call, Extend):
                text[call.slot] += list(call.tokens)
            elif isinstance(call, VerifyCall):
                tree[call.slot] = [(call.pending, call.round_)]
            else:
                tree[call.slot].append((call.round_, call.first_row))
            assert batch.cached_len(call.slot) == len(text[call.slot])
            checked += 1

    def join() -> int:
        slot = batch.open()
        text[slot] = []
        return slot

    a, b = join(), join()
    run([Extend(a, tuple(tokens(50, 30))), Extend(b, tuple(tokens(51, 45)))])
    run([Extend(a, (777,)), Extend(b, (778, 779))])  # one token, and two (an unread row) in one decode
    t = len(text[a])
    one = make_round(t + 1, [(601, -1), (602, -1)])
    two = make_round(t + 1, [(601, -1), (602, -1), (603, 0), (604, 1), (605, 0)])
    three = make_round(t + 1, [(601, -1), (602, -1), (603, 0), (604, 1), (605, 0), (606, 2)])
    for short, long in ((one, two), (two, three)):
        assert list(long.token_ids[: short.n]) == list(short.token_ids)
    c = join()
    run([VerifyCall(a, 700, one), Extend(b, (780,)), Extend(c, tuple(tokens(52, 600)))])  # c: > 512 rows
    run([GrowRound(a, two, one.n), Extend(b, (781,)), Extend(c, (782,))])
    run([GrowRound(a, three, two.n), Extend(b, (783,)), Extend(c, (784,))])
    accepted = [0, int(np.flatnonzero(three.token_ids == 603)[0]), int(np.flatnonzero(three.token_ids == 606)[0])]
    batch.commit(a, accepted)
    text[a] += [700, 601, 603, 606]
    assert_slot_holds(batch, a, len(text[a]))
    run([Extend(a, (785,)), Extend(c, (786,))])  # after the commit: the accepted rows' cells are a's text
    batch.close(b)
    d = join()
    run([Extend(a, (787,)), Extend(c, (788, 789)), Extend(d, tuple(tokens(53, 20)))])
    for slot in (a, c, d):
        assert_slot_holds(batch, slot, len(text[slot]))
    return checked


@pytest.fixture(scope="module")
def long_single():
    b = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=1, n_ctx=1024, max_tree_leaves=LEAVES)
    yield b
    b.close()


def test_draft_many_gives_every_slot_what_a_lone_draft_model_gives(long_single, tol, exact):
    batch = LlamaCppBatch.from_backend(long_single, max_slots=3, max_tree_leaves=LEAVES, slot_ctx=1024)
    try:
        assert draft_many_scenario(long_single, batch, tol, exact) == 18
        with pytest.raises(BackendError, match="twice"):
            batch.draft_many([Extend(0, (5,)), Extend(0, (6,))])
    finally:
        batch.free()


def test_a_tree_level_grown_without_its_ancestors_is_caught(long_single, tol, exact):
    batch = _SiblingAncestors.from_backend(long_single, max_slots=3, max_tree_leaves=LEAVES, slot_ctx=1024)
    try:
        with pytest.raises(AssertionError, match="GrowRound"):
            draft_many_scenario(long_single, batch, tol, exact)
    finally:
        batch.free()


def test_a_chain_only_batch_keeps_one_kv_stream_per_slot(single, probe, tol):
    """No tree leaves: one KV stream per slot, so a slot's rows attend over its own cells only.
    Its rows match the single backend at least as closely as the unified batch's (bit-identical
    wherever the kernels are row-invariant: the run in benchmarks/llamacpp_exactness/ measured 0.0)."""
    chains = LlamaCppBatch.from_backend(single, max_slots=3, max_tree_leaves=0, slot_ctx=SLOT_CTX)
    try:
        trees = LlamaCppBatch.from_backend(single, 1, max_tree_leaves=1, slot_ctx=SLOT_CTX)
        assert not chains.unified and trees.unified
        trees.free()
        cases = probe_batch_invariance(chains, single, slot_counts=(1, 3), candidates=(0, 3), prefix_len=16)
        assert max(c.vs_single for c in cases) <= max(c.vs_single for c in probe) <= tol
        slots = [chains.open() for _ in range(3)]
        text = {s: tokens(20 + 5 * i, 40 + i) for i, s in enumerate(slots)}
        got = chains.verify_many([VerifyCall(s, text[s][-1], None, tuple(text[s][:-1])) for s in slots])
        for s, logits in zip(slots, got):
            assert_close(np.array(logits.logits), single_rows(single, [], text[s][-1], None, text[s][:-1]), tol,
                         False, f"slot {s} prompt")
            chains.commit(s, [])
        chains.close(slots[1])  # a leave frees its stream; a join starts empty
        joined = chains.open()
        assert chains.cached_len(joined) == 0
        prompt = tokens(18, 77)
        (row,) = chains.verify_many([VerifyCall(joined, prompt[-1], None, tuple(prompt[:-1]))])
        assert_close(np.array(row.logits), single_rows(single, [], prompt[-1], None, prompt[:-1]), tol, False,
                     "joined slot")
    finally:
        chains.free()
