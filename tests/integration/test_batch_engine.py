"""Many requests in one round (`draftwise.batch`) on the transformers backend: each request's
output is the one it has decoded alone, whoever shared its rounds, joined or left; failures and
cancellations stay with their request; seeded sampling inside a batch keeps the target's law."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.runtime.engine import Engine, Failed, Finished, Tokens
from draftwise.runtime.strategy import RoundStrategy
from draftwise.runtime.guard import Arm, DoNoHarm
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import BackendError, ContractError, InputError
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.spec import Guard
from tests.helpers import make_spec
from tests.integration.test_batch_drafting import shared_draft_rounds
from tests.integration.tiny_models import V, chi_square_p, exact_joint, tiny_backend

# prompts of different lengths that repeat themselves, so prompt lookup proposes from round 1
PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6], [7, 1, 7, 1], [2, 3, 2, 3, 2, 3, 2, 3, 1], [6, 5, 4, 6, 5],
           [3, 3, 3], [5, 1, 5, 1, 5, 2, 5]]
GREEDY = GenerationConfig(max_new_tokens=12)


@pytest.fixture(scope="module")
def tiny():
    return tiny_backend(3)


def solo(target, spec, prompt) -> tuple[int, ...]:
    return build_decoder(spec, target).generate(prompt).tokens


def batch_of(target, spec, max_slots: int) -> Engine:
    return batch_decoder(spec, TransformersBatch.from_backend(target, max_slots))


@pytest.mark.parametrize("options", [dict(proposer="none"), dict(proposer="prompt-lookup", lookup=3, guard="false"),
                                     dict(proposer="prompt-lookup", lookup=2, candidates=3, guard="false"),
                                     dict(proposer="prompt-lookup", lookup=3)],
                         ids=["plain", "lookup-chain", "lookup-tree", "lookup-guarded"])
def test_greedy_batch_is_each_request_decoded_alone(tiny, options):
    spec = make_spec(GREEDY, **options)
    alone = [solo(tiny, spec, p) for p in PROMPTS]
    batch = batch_of(tiny, spec, max_slots=3)  # 7 requests through 3 slots: joins and leaves between rounds
    results = batch.generate_many(PROMPTS)
    assert [r.tokens for r in results] == alone
    shared = [r for r in batch.forwards if len(r.requests) > 1]
    assert shared and max(len(r.requests) for r in batch.forwards) == 3
    for request, (prompt, result) in enumerate(zip(PROMPTS, results)):  # each row's origin_request is its own
        rows = [int((r.origin_request == request).sum()) for r in batch.forwards if request in r.requests]
        assert rows == [(len(prompt) - 1 if k == 0 else 0) + 1 + record.nodes for k, record in enumerate(result.records)]
    if options["proposer"] != "none" and options.get("guard") == "false":
        assert sum(res.stats.mean_accepted > 0 for res in results) >= 3  # speculation really happened
    if options.get("guard") is None and options["proposer"] != "none":  # the guard played both arms
        assert batch.strategy.harm is not None and {r.arm for r in batch.strategy.harm.ledger} == {Arm.PLAIN, Arm.SPECULATE}


def test_events_stream_each_request_and_leave_at_once(tiny):
    spec = make_spec(GREEDY, proposer="prompt-lookup")
    target = TransformersBatch.from_backend(tiny, 4)
    batch = batch_decoder(spec, target)
    ids = [batch.submit(p, replace(GREEDY, max_new_tokens=n)) for p, n in zip(PROMPTS[:3], (3, 12, 6))]
    streamed: dict[int, list[int]] = {i: [] for i in ids}
    finished: dict[int, tuple[int, ...]] = {}
    while not batch.idle():
        for event in batch.step():
            if isinstance(event, Tokens):
                streamed[event.request].extend(event.tokens)
            elif isinstance(event, Finished):
                finished[event.request] = event.result.tokens
                assert event.request not in batch.active  # left in the round it finished
        assert len(target.open_slots()) == len(batch.active)  # a finished request's KV is freed at once
    assert {i: tuple(t) for i, t in streamed.items()} == finished
    assert [len(finished[i]) for i in ids] == [3, 12, 6]


def test_a_failing_request_ends_alone_and_the_others_are_untouched(tiny):
    spec = make_spec(GREEDY, proposer="prompt-lookup")
    alone = [solo(tiny, spec, p) for p in PROMPTS[:3]]
    batch = batch_of(tiny, spec, 4)
    too_long = [1, 2] * 40  # 80 tokens: over the tiny model's context of 64
    outcome = batch.generate_many([PROMPTS[0], too_long, PROMPTS[1], PROMPTS[2]])
    assert isinstance(outcome[1], InputError) or isinstance(outcome[1], BackendError)
    assert [outcome[0].tokens, outcome[2].tokens, outcome[3].tokens] == alone


def test_a_proposer_error_mid_generation_fails_its_request_only(tiny):
    spec = make_spec(GREEDY, proposer="prompt-lookup")
    alone = [solo(tiny, spec, p) for p in PROMPTS[:2]]
    target = TransformersBatch.from_backend(tiny, 3)
    healthy = batch_decoder(spec, target).decoder_for

    def decoder_for(slot, config):
        decoder = healthy(slot, config)
        if config.seed == 99:  # the planted failure: this request's proposer breaks in round 3
            proposer = decoder.proposers[0]
            calls = {"n": 0}
            original = proposer.propose

            def broken(*args, **kwargs):
                calls["n"] += 1
                if calls["n"] == 3:
                    raise RuntimeError("planted proposer failure")
                return original(*args, **kwargs)

            proposer.propose = broken
        return decoder

    batch = Engine(target, decoder_for, GREEDY)
    outcome = batch.generate_many([PROMPTS[0], PROMPTS[3], PROMPTS[1]],
                                  [GREEDY, replace(GREEDY, seed=99), GREEDY])
    assert isinstance(outcome[1], RuntimeError) and "planted" in str(outcome[1])
    assert [outcome[0].tokens, outcome[2].tokens] == alone
    assert target.open_slots() == ()


def test_cancel_frees_the_slot_and_the_rest_go_on(tiny):
    spec = make_spec(GREEDY, proposer="prompt-lookup")
    alone = solo(tiny, spec, PROMPTS[1])
    target = TransformersBatch.from_backend(tiny, 2)
    batch = batch_decoder(spec, target)
    first, second = batch.submit(PROMPTS[0]), batch.submit(PROMPTS[1])
    batch.step()
    batch.step()
    batch.cancel(first)
    third = batch.submit(PROMPTS[2])  # joins the freed slot
    events = list(batch.events())
    cancelled = [e for e in events if isinstance(e, Failed) and e.cancelled]
    assert [e.request for e in cancelled] == [first]
    finished = {e.request: e.result.tokens for e in events if isinstance(e, Finished)}
    assert finished[second] == alone and finished[third] == solo(tiny, spec, PROMPTS[2])
    assert target.open_slots() == ()


def test_a_planted_fault_sending_logits_to_the_wrong_request_is_caught(tiny):
    """The identity check above must fail if the engine mixed up whose logits are whose."""
    spec = make_spec(GREEDY, proposer="none")
    alone = [solo(tiny, spec, p) for p in PROMPTS[:3]]

    class Rotated(Engine):
        def _verify(self, waiting):
            pairs, forward = super()._verify(waiting)
            logits = [logits for _, logits in pairs]
            return list(zip([r for r, _ in pairs], logits[1:] + logits[:1])), forward

    healthy = batch_of(tiny, spec, 3)
    faulty = Rotated(healthy.target, healthy.decoder_for, GREEDY)
    assert [r.tokens for r in faulty.generate_many(PROMPTS[:3])] != alone


def test_seeded_sampling_does_not_depend_on_batch_mates(tiny):
    policy = SamplingPolicy(temperature=1.0)
    spec = make_spec(GenerationConfig(max_new_tokens=10, policy=policy), proposer="prompt-lookup")
    config = GenerationConfig(max_new_tokens=10, policy=policy, seed=7)
    alone = build_decoder(replace(spec, generation=replace(spec.generation, seed=7)), tiny).generate(PROMPTS[0]).tokens
    for mates in ([PROMPTS[1], PROMPTS[2]], [PROMPTS[3]], [PROMPTS[4], PROMPTS[5], PROMPTS[6]]):
        batch = batch_of(tiny, spec, 4)
        configs = [config] + [replace(config, seed=s) for s in range(len(mates))]
        assert batch.generate_many([PROMPTS[0], *mates], configs)[0].tokens == alone


def test_sampling_inside_a_batch_emits_the_targets_law(tiny):
    """Chi-square per request: 1200 seeded requests of one prompt, decoded 6 at a time with prompt
    lookup drafting from round 1, emit the target's joint law of their first two tokens."""
    policy = SamplingPolicy(temperature=1.0)
    prompt = [1, 2, 1, 2, 1]  # lookup proposes "2 1" after "... 1"
    # unguarded: a guard adds no rows to a prompt read before it measured speculation to pay
    spec = make_spec(GenerationConfig(max_new_tokens=2, policy=policy), proposer="prompt-lookup", lookup=2, guard="false")
    batch = batch_of(tiny, spec, 6)
    samples = 1200
    results = batch.generate_many([prompt] * samples,
                                  [GenerationConfig(max_new_tokens=2, policy=policy, seed=s) for s in range(samples)])
    counts = np.zeros((V, V))
    for result in results:
        assert result.records[0].nodes > 0, "round 1 must verify drafts for the test to mean anything"
        counts[result.tokens[0], result.tokens[1]] += 1
    assert chi_square_p(counts, exact_joint(tiny, policy, prompt)) > 1e-3


@pytest.mark.parametrize("family", ["medusa", "hydra", "clover"])
def test_draft_heads_read_each_slots_own_hidden_state(tiny, family, tmp_path):
    """Heads in a batch read the frontier state of their own slot: each request's greedy output
    and its drafts round by round are the ones it has decoded alone (6 requests through 3 slots)."""
    from tests.integration.tiny_heads import random_headset, save_headset

    directory = save_headset(tmp_path / "heads", random_headset(family, tiny, seed=5, num_heads=3, draft_vocab=6))
    spec = make_spec(GREEDY, proposer=family, heads=directory, verifier="greedy", tree="cartesian:2,2", guard="false")
    alone = [build_decoder(spec, tiny).generate(p) for p in PROMPTS[:6]]
    batch = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3))
    results = batch.generate_many(PROMPTS[:6])
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert [accepted_per_round(r) for r in results] == [accepted_per_round(a) for a in alone]
    assert sum(sum(r.from_draft) for r in results) > 0  # the heads' drafts were accepted somewhere


def test_a_batch_that_gave_heads_another_slots_state_would_be_caught(tiny, tmp_path):
    """Planted fault: every slot's frontier read from slot 0 must change the drafts compared above."""
    from tests.integration.tiny_heads import random_headset, save_headset

    class CrossedFrontier(TransformersBatch):
        def frontier_hidden(self, slot):
            return super().frontier_hidden(min(self.open_slots()))

    directory = save_headset(tmp_path / "heads", random_headset("medusa", tiny, seed=5, num_heads=3, draft_vocab=6))
    spec = make_spec(GREEDY, proposer="medusa", heads=directory, verifier="greedy", tree="cartesian:2,2", guard="false")
    alone = [accepted_per_round(build_decoder(spec, tiny).generate(p)) for p in PROMPTS[:4]]
    crossed = batch_decoder(spec, CrossedFrontier(tiny, 4)).generate_many(PROMPTS[:4])
    assert [accepted_per_round(r) for r in crossed] != alone


@pytest.mark.parametrize("options", [dict(k=3), dict(tree="wbd:2,1")], ids=["chain", "tree"])
def test_a_draft_model_drafts_for_each_request_on_its_own_kv(tiny, options):
    """Each request of a batch drafts on a slot of its own of the batched draft model (its own
    KV; every request's draft step in one forward, `test_batch_drafting.py`): every request's
    greedy output is the one it decodes alone, with 5 requests through 2 slots."""
    draft = tiny_backend(5)
    spec = make_spec(GREEDY, proposer="draft-model", draft="tiny", guard="false", **options)
    alone = [build_decoder(spec, tiny, draft).generate(p) for p in PROMPTS[:5]]
    batch = batch_decoder(spec, TransformersBatch.from_backend(tiny, 2), draft)
    results = batch.generate_many(PROMPTS[:5])
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    # the same drafts as alone, round by round: what each request's draft model saw was its own text
    assert [accepted_per_round(r) for r in results] == [accepted_per_round(a) for a in alone]
    assert any(r.stats.mean_accepted > 0 for r in results)  # the drafts were verified, and some accepted


def accepted_per_round(result) -> list[tuple[int, int]]:
    return [(record.nodes, record.accepted) for record in result.records]


def test_a_draft_model_on_another_backend_is_refused_for_batches_by_name(tiny):
    fake = type("OtherDraft", (), {"info": replace(tiny.info, name="vllm")})()  # neither transformers nor llama.cpp
    with pytest.raises(InputError, match="transformers and llama.cpp backends, not vllm"):
        batch_decoder(make_spec(GREEDY, proposer="draft-model", draft="x", k=3), TransformersBatch.from_backend(tiny, 2), fake)


@pytest.mark.model
def test_real_model_batch_is_token_identical_to_plain_decoding(smol_target, smol_chat_and_plain):
    """The embedded model, fp32: the Spec-Bench chat prompts, four at a time, prompt lookup, each
    request's greedy answer equal to its plain single-request answer."""
    from tests.integration.conftest import GREEDY_NEW

    spec = make_spec(GenerationConfig(max_new_tokens=GREEDY_NEW), proposer="prompt-lookup")
    batch = batch_decoder(spec, TransformersBatch.from_backend(smol_target, 4))
    results = batch.generate_many([p for p, _ in smol_chat_and_plain])
    assert [r.tokens for r in results] == [plain for _, plain in smol_chat_and_plain]


def test_a_batch_gate_prices_rows_by_the_batch_size(tiny, tmp_path):
    """Two requests share every round.  Where the batch profile says each row costs a full step
    at B = 2, the gate verifies pending rows only (plain batched decoding); with the batch-1
    profile (rows nearly free) the same requests speculate.  Both are the requests' own greedy
    outputs."""
    from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
    from draftwise.spec import GateProfile

    def profile(relative):
        return VerifyCostProfile(rows=tuple(range(1, len(relative) + 1)), relative=tuple(relative), absolute_s=None,
                                 model=tiny.info.checkpoint, backend="transformers", threads=1, machine="test")

    flat, linear = profile([1.0] * 12), profile([float(n) for n in range(1, 13)])
    flat.save(tmp_path / "single")
    BatchCostProfile({1: flat, 2: linear}).save(tmp_path / "batches")
    spec = make_spec(GREEDY, proposer="prompt-lookup", lookup=3)
    prompts = [PROMPTS[1], PROMPTS[3]]
    alone = [solo(tiny, spec, p) for p in prompts]
    by_batch = replace(spec, gate=GateProfile(tmp_path / "single", tmp_path / "batches"))
    flat_only = replace(spec, gate=GateProfile(tmp_path / "single"))
    cut = batch_of(tiny, by_batch, 2).generate_many(prompts)
    kept = batch_of(tiny, flat_only, 2).generate_many(prompts)
    assert [r.tokens for r in cut] == alone == [r.tokens for r in kept]
    shared = min(len(r.records) for r in cut)  # both joined in the first round: rounds 0..shared-1 were shared
    assert shared > 3 and all(record.nodes == 0 for r in cut for record in r.records[1:shared])
    assert any(record.nodes > 0 for r in kept for record in r.records[1:])


def _waiting_request(request_id, paths, expected):
    from draftwise.runtime.round import VerifyRequest
    from draftwise.topology.compile import compile_round
    from tests.helpers import result_from_paths

    round_ = compile_round(10, [result_from_paths(paths)])
    return request_id, VerifyRequest(5, round_, (), expected)


def test_the_batch_cuts_every_gated_round_to_the_depth_that_pays_for_the_batch(tiny):
    """Two gated requests with 4-deep chains: one likely accepted, one not.  Where every extra row
    costs most of a step at B = 2, the widest request would make both pay, and the batch is best
    off with pending rows only; where rows are free it verifies everything."""
    from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile

    def profile(relative):
        return VerifyCostProfile(rows=tuple(range(1, len(relative) + 1)), relative=tuple(relative), absolute_s=None,
                                 model="m", backend="transformers", threads=1, machine="test")

    sure = _waiting_request(0, [[1, 2, 3, 4]], (0.0, 0.9, 1.7, 2.4, 3.0))
    unlikely = _waiting_request(1, [[5, 6, 7, 1]], (0.0, 0.1, 0.12, 0.13, 0.14))
    costly = RoundStrategy(profile=BatchCostProfile({2: profile([1, 1.9, 2.8, 3.7, 4.6])}))
    cut = costly.cuts([sure, unlikely])
    assert {i: r.n for i, r in cut.items()} == {0: 0, 1: 0}  # (1 + 1) / 1 beats (1.9 + 1.1) / 1.9 and deeper
    cheap = RoundStrategy(profile=BatchCostProfile({2: profile([1.0] * 5)}))
    assert cheap.cuts([sure, unlikely]) == {}  # free rows: nothing is cut
    middling = RoundStrategy(profile=BatchCostProfile({2: profile([1.0, 1.05, 1.1, 2.5, 3.0])}))
    assert {i: r.n for i, r in middling.cuts([sure, unlikely]).items()} == {0: 2, 1: 2}  # (2.7 + 1.12) / 1.1 = 3.47 beats 2.86, 2 and 1.8


def test_the_guard_cuts_to_plain_rounds_when_they_measure_faster_and_output_is_unchanged(tiny):
    """A guard whose clock says speculation is slow plays plain rounds (one row per request) but
    for its explorations, and every request's output is still the one decoded alone."""
    spec = make_spec(GREEDY, proposer="prompt-lookup", lookup=3)
    alone = [solo(tiny, spec, p) for p in PROMPTS]

    # the measured seconds of a speculating round, times ten: the rounds take ~2 ms, and on a busy
    # machine one plain round can take several times that (tripled, it failed once under load)
    class SlowSpeculation(DoNoHarm):
        def observe(self, batch, arm, tokens, seconds, explored):
            super().observe(batch, arm, tokens, seconds * (10.0 if arm is Arm.SPECULATE else 1.0), explored)

    healthy = batch_of(tiny, spec, 3)
    guarded = Engine(healthy.target, healthy.decoder_for, GREEDY, RoundStrategy(SlowSpeculation()))
    results = guarded.generate_many(PROMPTS)
    assert [r.tokens for r in results] == alone
    at_three = [r for r in guarded.strategy.harm.ledger if r.batch == 3]
    assert sum(r.arm is Arm.PLAIN for r in at_three) > 0.6 * len(at_three)
    plain_rounds = [r for r in guarded.forwards if len(r.requests) == 3 and max(r.rows) == 1]
    assert plain_rounds  # the plain arm really verified one row per request


def test_a_guard_adds_candidate_rows_to_a_prompt_read_only_where_speculation_measured_to_pay(tiny):
    """A batch reads its joining requests' prompts in a shared forward where every row costs about a
    decoding row's price, so a guarded batch verifies a prompt round's candidates only at a batch
    size where its controller measured speculation to pay; an unguarded batch verifies them all.
    Output is each request's own either way."""
    spec = make_spec(GREEDY, proposer="prompt-lookup", lookup=3)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]  # lookup proposes "3 1 2" from round 1
    prompts = [prompt] * 3
    alone = solo(tiny, spec, prompt)

    def prompt_rows(decoder):
        return list(decoder.forwards[0].rows)

    unguarded = batch_of(tiny, replace(spec, guard=Guard.OFF), 3)
    assert [r.tokens for r in unguarded.generate_many(prompts)] == [alone] * 3
    prompt_len = len(prompt)
    assert all(rows > prompt_len for rows in prompt_rows(unguarded)), "the prompt must offer candidates"

    guarded = batch_of(tiny, spec, 3)
    assert [r.tokens for r in guarded.generate_many(prompts)] == [alone] * 3
    assert prompt_rows(guarded) == [prompt_len] * 3  # unread + pending rows only: nothing measured yet

    class Proven(DoNoHarm):  # speculation measured to pay at every batch size
        def proven(self, batch):
            return True

    trusting = Engine(guarded.target, guarded.decoder_for, GREEDY, RoundStrategy(Proven()))
    assert [r.tokens for r in trusting.generate_many(prompts)] == [alone] * 3
    assert prompt_rows(trusting) == prompt_rows(unguarded)


def test_a_round_answered_with_rows_that_are_not_a_cut_of_it_is_refused(tiny):
    from draftwise.runtime.round import Verified

    spec = make_spec(GREEDY, proposer="prompt-lookup", lookup=3)

    class Forged(Engine):
        def _verify(self, waiting):
            rounds = {request.id: request.stop.round_ for request in waiting}
            pairs, forward = super()._verify(waiting)
            forged = []
            for request, logits in pairs:
                round_ = rounds[request.id]
                if round_ is not None and round_.n and not isinstance(logits, BaseException):
                    other = _waiting_request(99, [[(int(round_.token_ids[0]) + 1) % V]], (0.0, 0.5))[1].round_
                    logits = Verified(other, logits)
                forged.append((request, logits))
            return forged, forward

    healthy = batch_of(tiny, spec, 2)
    outcome = Forged(healthy.target, healthy.decoder_for, GREEDY).generate_many(PROMPTS[:2])
    assert any(isinstance(o, ContractError) and "not a depth cut" in str(o) for o in outcome)


NEAR_TIE = 1.5  # logits: above every batch-vs-alone difference the batch probe measured (<= 1.13)


@pytest.mark.model
@pytest.mark.llamacpp
def test_llamacpp_batches_every_request_and_parts_from_plain_only_at_near_ties():
    """llama.cpp: rows computed in a shared batch may round differently from rows decoded alone
    (`invariance.probe_batch_invariance`), so a batched greedy answer may part from the
    request's own plain answer, but only where the two tokens are a near-tie for the target."""
    pytest.importorskip("llama_cpp")
    from draftwise.backends.load import open_batch
    from draftwise.measure.load import load_backend

    target = load_backend("smollm2-135m", "llamacpp", threads=2)
    spec = make_spec(GenerationConfig(max_new_tokens=16), proposer="prompt-lookup", backend="llamacpp")
    prompts = llamacpp_prompts(target)
    shared = batch_decoder(spec, open_batch(target, 3))
    results = shared.generate_many(prompts)
    assert max(len(r.requests) for r in shared.forwards) == 3
    assert_parts_only_at_near_ties(target, spec, prompts, results)


def llamacpp_prompts(target) -> list[list[int]]:
    return [target.chat_prompt([{"role": "user", "content": q}])
            for q in ("Write a Python function that reverses a list.", "Name three prime numbers.",
                      "def add(a, b):\n    return a + b\n\nRewrite add with type hints.")]


def assert_parts_only_at_near_ties(target, spec, prompts, results) -> None:
    """Each batched answer is its request's own plain answer, or parts from it where the two
    tokens are a near-tie for the target (llama.cpp's shared rows round differently)."""
    alone = [build_decoder(spec.plain(), target).generate(p).tokens for p in prompts]
    for prompt, mine, own in zip(prompts, results, alone):
        assert len(mine.tokens) == 16 or mine.stop_reason == "eos"
        k = next((i for i, (a, b) in enumerate(zip(mine.tokens, own)) if a != b), None)
        if k is None:
            continue
        context = [*prompt, *own[:k]]
        target.reset()
        target.extend(context[:-1])
        row = np.asarray(target.verify(context[-1], None).logits[0])  # [V] the target's own next-token logits
        target.rollback()
        assert abs(float(row[mine.tokens[k]]) - float(row[own[k]])) < NEAR_TIE, (k, mine.tokens[k], own[k])


@pytest.mark.model
@pytest.mark.llamacpp
@pytest.mark.parametrize("options", [dict(k=3), dict(tree="wbd:2,2,1")], ids=["chain", "tree"])
def test_a_llamacpp_draft_model_drafts_for_the_whole_batch_in_one_decode_per_step(options):
    """A draft model on llama.cpp drafts for every request of a round in one `draft_many` per
    draft level (a slot per request on the draft's own batch context), and each answer parts
    from the request's plain answer only at near-ties.  The draft is the target's own weights:
    every draft is accepted unless rounding parts them, so each round drafts as deep as it may."""
    pytest.importorskip("llama_cpp")
    from draftwise.backends.load import open_batch
    from draftwise.measure.load import load_backend

    target = load_backend("smollm2-135m", "llamacpp", threads=2)
    draft = load_backend("smollm2-135m", "llamacpp", threads=2)
    spec = make_spec(GenerationConfig(max_new_tokens=16), proposer="draft-model", draft="smollm2-135m",
                     backend="llamacpp", guard="false", **options)
    prompts = llamacpp_prompts(target)
    shared = batch_decoder(spec, open_batch(target, 3), draft)
    results = shared.generate_many(prompts)
    assert sum(sum(r.from_draft) for r in results) >= 16  # drafts were accepted
    assert shared_draft_rounds(shared, results) >= 3  # rounds where several requests drafted in the same decodes
    assert_parts_only_at_near_ties(target, spec, prompts, results)


def test_every_round_asks_before_proposing_and_takes_orders_only(tiny):
    """Every round stops at an `Ask` before its proposals (round 1 says it reads the prompt); a
    plain order proposes nothing; an answer that is not `Orders` is refused."""
    from draftwise.runtime.round import Ask, Orders, VerifyRequest

    spec = make_spec(GREEDY, proposer="prompt-lookup", lookup=3, guard="false")
    decoder = build_decoder(spec, tiny)
    run = decoder.coroutine(PROMPTS[1])
    first = run.send(None)
    assert first == Ask(reads_prompt=True)
    verify = run.send(Orders())
    assert isinstance(verify, VerifyRequest) and verify.unread
    step = run.send(tiny.verify(verify.pending, verify.round_, unread=verify.unread))
    while not isinstance(step, Ask):  # the published tokens, then round 2's question
        assert not isinstance(step, VerifyRequest)
        step = run.send(None)
    assert step == Ask(reads_prompt=False)
    plain = run.send(Orders(Arm.PLAIN))
    assert isinstance(plain, VerifyRequest) and plain.round_ is None  # nothing proposed
    step = run.send(tiny.verify(plain.pending, None))
    while not isinstance(step, Ask):
        step = run.send(None)
    with pytest.raises(ContractError, match="answered with Orders"):
        run.send(Arm.SPECULATE)
    run.close()
