"""Drafting for every request of a round in one call (issue 43): a draft model runs as a batch
with one slot per request (`DraftBatch.draft_many`), the head families run one head forward per
level over every request's rows (`HeadForward.draft_many`), and each request's greedy output
AND its drafts round by round are the ones it makes decoded alone (requests join and leave
between rounds; their prompts, so their padded lengths, differ).

Planted faults that these checks must catch: draft rows of one request answered to another
(the batch order swapped), a draft slot whose rejected rows are not dropped (stale KV), a draft
slot never freed when its request leaves, a tree level's rows left where the forward wrote them
(not next to their provisional ancestors), head outputs handed to the wrong request."""

from __future__ import annotations

import pytest

from draftwise.backends import load
from draftwise.backends.batch import Extend, GrowRound, VerifyCall
from draftwise.backends.transformers import TransformersBackend
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.proposers import heads as heads_module
from draftwise.topology.compile import compile_round
from tests.helpers import make_spec, path_to, result_from_paths
from tests.integration.test_transformers_batch import assert_same, solo_of
from tests.integration.tiny_models import tiny_backend

PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6], [7, 1, 7, 1], [2, 3, 2, 3, 2, 3, 2, 3, 1], [6, 5, 4, 6, 5],
           [3, 3, 3], [5, 1, 5, 1, 5, 2, 5]]
GREEDY = GenerationConfig(max_new_tokens=12)
# a tree of 4 levels grows its provisional rows 3 times (`GrowRound`) on top of one verify
DRAFTS = [dict(k=3), dict(k=4, confidence=0), dict(tree="wbd:2,1"), dict(tree="wbd:2,2,1,1")]
DRAFT_IDS = ["chain", "chain-no-stop", "tree-2", "tree-4"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_backend(3)


@pytest.fixture(scope="module")
def draft():
    return tiny_backend(5)


def per_round(result) -> list[tuple]:
    """What a request drafted and kept each round: rows, depth, accepted, and the slot path."""
    return [(r.nodes, r.proposal_depth, r.accepted, r.slot_path) for r in result.records]


def draft_spec(**options):
    return make_spec(GREEDY, proposer="draft-model", draft="tiny", guard="false", **options)


# ---- the draft model ---------------------------------------------------------------------------
@pytest.mark.parametrize("options", DRAFTS, ids=DRAFT_IDS)
def test_a_draft_model_drafts_for_every_request_in_one_forward_per_step(tiny, draft, options):
    """7 requests through 3 slots: outputs and per-round drafts equal each request's alone, and
    every round's draft steps cost one forward each for the whole batch (the deepest request's
    levels), not one per request."""
    spec = draft_spec(**options)
    alone = [build_decoder(spec, tiny, draft).generate(p) for p in PROMPTS]
    batch = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3), draft)
    results = batch.generate_many(PROMPTS)
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert [per_round(r) for r in results] == [per_round(a) for a in alone]
    assert sum(sum(r.from_draft) for r in results) > 0  # drafts were accepted somewhere
    assert shared_draft_rounds(batch, results) >= 5


def shared_draft_rounds(batch, results) -> int:
    """Check that every batch round answered its draft steps in one call per draft level (the
    deepest request's levels), whatever the number of requests; return the rounds where several
    requests drafted in the same calls."""
    seen = {i: 0 for i in range(len(results))}  # the i-th batch round a request took part in is its i-th round
    shared = 0
    for round_ in batch.forwards:
        steps = []
        for request in round_.requests:
            steps.append(results[request].records[seen[request]].proposal_depth)
            seen[request] += 1
        assert round_.draft_calls == max(steps), (round_, steps)  # one forward per draft level
        shared += len(round_.requests) > 1 and sum(s > 0 for s in steps) > 1
    return shared


def test_the_draft_slots_are_freed_as_requests_leave(tiny, draft, monkeypatch):
    made = []

    def recording(model, max_slots):
        made.append(TransformersBatch.from_backend(model, max_slots))
        return made[-1]

    monkeypatch.setattr(load, "draft_batch", recording)
    batch = batch_decoder(draft_spec(k=3), TransformersBatch.from_backend(tiny, 2), draft)
    batch.generate_many(PROMPTS[:5])
    assert len(made) == 1 and made[0].open_slots() == ()


class SwappedDrafts(TransformersBatch):
    """Planted fault: the answers of a shared draft step handed back in reverse request order."""

    def draft_many(self, calls):
        return super().draft_many(calls)[::-1]


class StaleDrafts(TransformersBatch):
    """Planted fault: a slot keeps its rejected draft rows (truncate drops nothing)."""

    def truncate(self, slot, length):
        self.rollback(slot)


class NeverFreed(TransformersBatch):
    """Planted fault: a leaving request's draft slot is never closed."""

    def close(self, slot):
        pass


class UnplacedLevels(TransformersBatch):
    """Planted fault: a tree level's rows stay where the forward wrote them."""

    def _move(self, row, source, to, count):
        if self._slots and all(s.rows for s in self._slots.values() if s.row == row):
            return  # only the level placement (a provisional slot) is skipped; unread rows still move
        super()._move(row, source, to, count)


@pytest.mark.parametrize("fault, options", [(SwappedDrafts, dict(k=3)), (SwappedDrafts, dict(tree="wbd:2,1")),
                                            (StaleDrafts, dict(k=3)), (NeverFreed, dict(k=3))],
                         ids=["swapped-chain", "swapped-tree", "stale-kv", "never-freed"])
def test_planted_draft_faults_are_caught(tiny, draft, monkeypatch, fault, options):
    spec = draft_spec(**options)
    alone = [per_round(build_decoder(spec, tiny, draft).generate(p)) for p in PROMPTS]
    monkeypatch.setattr(load, "draft_batch", lambda model, slots: fault(model, slots))
    outcome = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3), draft).generate_many(PROMPTS)
    assert [per_round(r) if hasattr(r, "records") else r for r in outcome] != alone


# ---- the draft batch backend: draft_many against lone backends -----------------------------------
def tree_levels(prefix_len: int):
    """A draft tree's rounds level by level, each holding the rows of the last first."""
    paths = [[[1], [2]], [[1], [2], [1, 3], [2, 4], [1, 5]], [[1], [2], [1, 3], [2, 4], [1, 5], [1, 3, 6]]]
    rounds = [compile_round(prefix_len, [result_from_paths(p)]) for p in paths]
    for short, long in zip(rounds, rounds[1:]):
        assert list(long.token_ids[: short.n]) == list(short.token_ids)
    return rounds


def draft_many_scenario(batch_type=TransformersBatch, base=None, lone=solo_of) -> int:
    """Slots of different lengths through extends (short and prompt-long), a tree's verify and its
    next level in shared forwards, commits, a leave and a join; every call's logits equal a lone
    backend's (`lone(base)`: a fresh one on the same weights).  Returns the calls compared."""
    base = tiny_backend(5) if base is None else base
    batch = batch_type(base, 3)
    solo: dict[int, TransformersBackend] = {}
    checked = 0

    def run(calls):
        nonlocal checked
        got = batch.draft_many(calls)
        for call, logits in zip(calls, got):
            lone = solo[call.slot]
            if isinstance(call, Extend):
                want = lone.extend(list(call.tokens))
            elif isinstance(call, GrowRound):
                want = lone.verify_more(call.round_, call.first_row)
            else:
                want = lone.verify(call.pending, call.round_)
            assert_same(logits, want, f"{type(call).__name__} on slot {call.slot}")
            assert batch.cached_len(call.slot) == lone.cached_len
            checked += 1

    def open_slot() -> int:
        slot = batch.open()
        solo[slot] = lone(base)
        solo[slot].reset()
        return slot

    a, b = open_slot(), open_slot()
    run([Extend(a, (1, 2, 3, 1, 2, 3, 4)), Extend(b, (5, 6, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3))])
    run([Extend(a, (7,)), Extend(b, (1, 2))])  # one token, and two (an unread row) in one forward
    batch.truncate(a, batch.cached_len(a) - 1)  # the last token becomes the pending one, as a draft tree does
    solo[a].truncate(solo[a].cached_len - 1)
    one, two, three = tree_levels(batch.cached_len(a) + 1)
    c = open_slot()
    long_prompt = tuple(int(t) % 8 for t in range(20))  # a prompt longer than the shared extends: a forward of its own
    run([VerifyCall(a, 7, one), Extend(b, (3,)), Extend(c, long_prompt)])  # a tree's first level beside extends
    # c's rows reach past the tree's: its next levels are written at the end, then moved next to their ancestors
    run([GrowRound(a, two, one.n), Extend(b, (4,)), Extend(c, (5,))])
    run([GrowRound(a, three, two.n), Extend(b, (5,)), Extend(c, (6,))])
    accepted = path_to(three, three.n - 1)
    batch.commit(a, accepted)
    solo[a].commit(accepted)
    run([Extend(a, (6,)), Extend(c, (1,))])  # after the commit: the accepted rows' KV is a's context
    batch.close(b)
    del solo[b]
    d = open_slot()
    run([Extend(a, (2,)), Extend(c, (3, 4)), Extend(d, (5, 6, 7))])
    run([Extend(a, (1,)), Extend(c, (2,)), Extend(d, (3,))])
    return checked


def test_draft_many_gives_every_slot_what_a_lone_draft_model_gives():
    assert draft_many_scenario() == 21


def test_draft_many_with_a_level_left_unplaced_is_caught():
    with pytest.raises(AssertionError, match="logits differ|argmax"):
        draft_many_scenario(UnplacedLevels)


# ---- the head families ---------------------------------------------------------------------------
def heads_spec(family, directory):
    return make_spec(GREEDY, proposer=family, heads=directory, verifier="greedy", tree="cartesian:2,2",
                     guard="false")


@pytest.mark.parametrize("family", ["medusa", "hydra", "clover"])
def test_heads_run_one_forward_per_level_for_every_request(tiny, family, tmp_path):
    from tests.integration.tiny_heads import random_headset, save_headset

    directory = save_headset(tmp_path / "heads", random_headset(family, tiny, seed=5, num_heads=3, draft_vocab=6))
    spec = heads_spec(family, directory)
    alone = [build_decoder(spec, tiny).generate(p) for p in PROMPTS]
    batch = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3))
    results = batch.generate_many(PROMPTS)
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert [per_round(r) for r in results] == [per_round(a) for a in alone]
    levels = 1 if family == "medusa" else 2  # Medusa: every depth from one state; else a forward per level
    assert max(r.draft_calls for r in batch.forwards) == levels
    assert sum(len(r.requests) > 1 and r.draft_calls > 0 for r in batch.forwards) >= 5


def test_head_outputs_handed_to_the_wrong_request_are_caught(tiny, tmp_path, monkeypatch):
    from tests.integration.tiny_heads import random_headset, save_headset

    real = heads_module.HeadForward.draft_many
    monkeypatch.setattr(heads_module.HeadForward, "draft_many", lambda self, steps: real(self, steps)[::-1])
    directory = save_headset(tmp_path / "heads", random_headset("hydra", tiny, seed=5, num_heads=3, draft_vocab=6))
    spec = heads_spec("hydra", directory)
    alone = [per_round(build_decoder(spec, tiny).generate(p)) for p in PROMPTS]  # alone: one step, nothing to swap
    batch = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3))
    assert [per_round(r) for r in batch.generate_many(PROMPTS)] != alone


def test_a_failing_draft_step_fails_its_request_only(tiny, draft, monkeypatch):
    """A draft step that cannot be answered (here: request 1's, whose slot raises) ends that
    request with the error; the shared call is retried request by request for the others."""

    class OneBadSlot(TransformersBatch):
        def draft_many(self, calls):
            if any(c.slot == 1 for c in calls) and len(self.open_slots()) == 3 and self.cached_len(1) > 6:
                raise RuntimeError("slot 1 broke")
            return super().draft_many(calls)

    spec = draft_spec(k=3)
    alone = [build_decoder(spec, tiny, draft).generate(p).tokens for p in PROMPTS[:3]]
    monkeypatch.setattr(load, "draft_batch", lambda model, slots: OneBadSlot(model, slots))
    outcome = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3), draft).generate_many(PROMPTS[:3])
    assert isinstance(outcome[1], RuntimeError)
    assert [outcome[0].tokens, outcome[2].tokens] == [alone[0], alone[2]]



@pytest.mark.parametrize("drafter", ["draft-model", "hydra"])
def test_a_plain_round_chosen_by_the_guard_drafts_nothing(tiny, draft, drafter, tmp_path):
    """The guard's arm is asked before anyone proposes: in every round it plays plain, no draft
    forward runs and each request verifies its pending row alone; outputs stay each request's
    alone.  Planted fault this catches: choosing the arm after drafting (the draft forwards of a
    plain round are paid and thrown away)."""
    from draftwise.runtime.engine import Engine
    from draftwise.runtime.strategy import RoundStrategy
    from draftwise.runtime.guard import Arm, DoNoHarm

    from tests.integration.tiny_heads import random_headset, save_headset

    if drafter == "draft-model":
        spec, model = draft_spec(k=3), draft
    else:  # the heads read the target's hidden states of the rounds they did not propose in too
        headset = random_headset(drafter, tiny, seed=5, num_heads=3, draft_vocab=6)
        spec, model = heads_spec(drafter, save_headset(tmp_path / "heads", headset)), None
    alone = [build_decoder(spec, tiny, model).generate(p).tokens for p in PROMPTS]

    class Alternating(DoNoHarm):  # plain on every other steady round, speculation on the rest
        def play(self, batch):
            return (Arm.PLAIN if len(self.ledger) % 2 == 0 else Arm.SPECULATE), False

    healthy = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3), model)
    guarded = Engine(healthy.target, healthy.decoder_for, GREEDY, RoundStrategy(Alternating()))
    results = guarded.generate_many(PROMPTS)
    assert [r.tokens for r in results] == alone
    plain = [r.arm is Arm.PLAIN for r in guarded.strategy.harm.ledger]
    assert sum(plain) >= 3 and not all(plain)
    records = [rec for res in results for rec in res.records]
    plain_records = [rec for rec in records if rec.guard_plain]
    assert plain_records and all(not rec.asked and rec.nodes == 0 for rec in plain_records)
    # the batch's rounds whose every request played plain ran no draft forward
    by_request = {i: iter(res.records) for i, res in enumerate(results)}
    plain_rounds = 0
    for round_ in guarded.forwards:
        recs = [next(by_request[i]) for i in round_.requests]
        if all(rec.guard_plain for rec in recs):
            plain_rounds += 1
            assert round_.draft_calls == 0, round_
            # a prompt read without candidates adds its prompt's rows; a steady plain round one row
            assert all(rows == 1 for rec, rows in zip(recs, round_.rows) if not rec.reads_prompt), round_
    assert plain_rounds >= 3


def gated_union_alone_and_in_a_batch(tiny, tmp_path, profile):
    """prompt-lookup+hydra (random tiny heads) behind the gate priced by `profile`: each prompt
    decoded alone, and all of them in a batch of three."""
    from draftwise.spec import GateProfile

    from tests.integration.tiny_heads import random_headset, save_headset

    profile.save(tmp_path / "profile")
    heads = save_headset(tmp_path / "heads", random_headset("hydra", tiny, seed=5, num_heads=3, draft_vocab=6))
    spec = make_spec(GREEDY, proposer="prompt-lookup+hydra", heads=heads, tree="cartesian:2,2", lookup=4,
                     guard="false", gate=GateProfile(tmp_path / "profile"))
    alone = [build_decoder(spec, tiny).generate(p) for p in PROMPTS]
    return alone, batch_decoder(spec, TransformersBatch.from_backend(tiny, 3)).generate_many(PROMPTS)


def test_a_gated_union_in_a_batch_cuts_per_source_and_keeps_each_requests_own_output(tiny, tmp_path):
    """prompt-lookup+hydra with the gate (one acceptance model per source) in shared rounds:
    every request's output equals its own alone with the same gate; the gate cut rounds (the
    profile makes rows cost), and the batch's deeper cuts of those rounds are depth cuts."""
    from draftwise.runtime.cost_profile import VerifyCostProfile

    steep = VerifyCostProfile(rows=tuple(range(1, 17)), relative=tuple([1.0, 1.02, 1.04] + [1.6] * 13), absolute_s=None,
                              model=tiny.info.checkpoint, backend="transformers", threads=1, machine="test")
    alone, results = gated_union_alone_and_in_a_batch(tiny, tmp_path, steep)
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert any(record.gated for r in results for record in r.records)


def test_a_gated_union_in_a_batch_skips_the_heads_where_their_rows_would_not_be_verified(tiny, tmp_path):
    """The same union where every row costs a plain step (a profile with seconds, so the heads'
    drafting time is priced): the gate would verify none of the heads' rows, so after their first
    proposals the heads are not asked (each request's own gate decides, inside the shared rounds),
    and every request's output is still its own alone."""
    from draftwise.runtime.cost_profile import VerifyCostProfile

    rows = tuple(range(1, 17))
    linear = VerifyCostProfile.from_absolute(rows, [1e-3 * n for n in rows], model=tiny.info.checkpoint,
                                             backend="transformers", threads=1, machine="test")
    alone, results = gated_union_alone_and_in_a_batch(tiny, tmp_path, linear)
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    # (with 1 ms steps prompt lookup's own drafting may price above the free threshold and be skipped too)
    unasked = sum("hydra" in record.unasked for r in results for record in r.records)
    assert unasked > 0
    assert unasked == sum(r.stats.by_source["hydra"]["unasked"] for r in results)  # the ledger counts them


def test_a_batchs_plain_rounds_carry_shadow_proposals_that_the_controller_counts(tiny):
    """Prompt lookup proposes from the context alone: in a batch's plain rounds each request may
    make a shadow proposal, never verified; once the published tokens decide it, what it would
    have committed reaches the batch's controller as speculation's evidence.  Outputs stay each
    request's alone; a draft model (state of its own) is never asked in a plain round."""
    from draftwise.runtime.engine import Engine
    from draftwise.runtime.strategy import RoundStrategy
    from draftwise.runtime.guard import Arm, DoNoHarm

    class Alternating(DoNoHarm):  # plain on every other steady round, speculation on the rest
        def play(self, batch):
            return (Arm.PLAIN if len(self.ledger) % 2 == 0 else Arm.SPECULATE), False

    spec = make_spec(GREEDY, proposer="prompt-lookup")
    alone = [build_decoder(spec, tiny).generate(p).tokens for p in PROMPTS]
    healthy = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3))
    guarded = Engine(healthy.target, healthy.decoder_for, GREEDY, RoundStrategy(Alternating()))
    results = guarded.generate_many(PROMPTS)
    assert [r.tokens for r in results] == alone
    shadowed = [rec for res in results for rec in res.records if rec.shadowed]
    assert shadowed and all(rec.guard_plain and rec.nodes == 0 for rec in shadowed)
    assert sum(state.shadows for state in guarded.strategy.harm._states.values()) > 0


def test_a_round_where_a_request_joins_plays_the_chosen_arm_for_the_others(tiny):
    """A round in which a request reads its prompt is not priced, but the batch's other requests
    still play the arm the guard chose: with plain chosen they verify their pending rows alone.
    Planted fault this catches: such rounds speculating unguarded (one per join in a closed loop)."""
    from draftwise.runtime.engine import Engine
    from draftwise.runtime.strategy import RoundStrategy
    from draftwise.runtime.guard import Arm, DoNoHarm

    class Plain(DoNoHarm):  # the guard has settled on plain at every batch size
        def play(self, batch):
            return Arm.PLAIN, False

        def chosen(self, batch):
            return Arm.PLAIN

    from dataclasses import replace

    spec = make_spec(GREEDY, proposer="prompt-lookup", lookup=3)
    configs = [replace(GREEDY, max_new_tokens=5 + 4 * (i % 3)) for i in range(len(PROMPTS))]  # staggered joins
    alone = [build_decoder(make_spec(c, proposer="prompt-lookup", lookup=3), tiny).generate(p).tokens
             for p, c in zip(PROMPTS, configs)]
    healthy = batch_decoder(spec, TransformersBatch.from_backend(tiny, 2))
    guarded = Engine(healthy.target, healthy.decoder_for, GREEDY, RoundStrategy(Plain()))
    results = guarded.generate_many(PROMPTS, configs)
    assert [r.tokens for r in results] == alone
    by_request = {i: iter(res.records) for i, res in enumerate(results)}
    joins = 0
    for round_ in guarded.forwards:
        records = [next(by_request[i]) for i in round_.requests]
        if any(rec.reads_prompt for rec in records) and len(records) > 1:
            joins += 1
            assert all(rec.nodes == 0 for rec in records if not rec.reads_prompt), round_
    assert joins >= 3
