"""The batch's do-no-harm controller (`draftwise.runtime.guard`): it converges to the arm that
commits more tokens per second, explores the other within its stated bound, follows a change,
and keeps each batch size's estimate apart."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.runtime.guard import Arm, DoNoHarm, DoNoHarmConfig
from draftwise.errors import InputError


def run(controller: DoNoHarm, rates: dict[Arm, float], rounds: int, batch: int = 4, seed: int = 0,
        noise: float = 0.0) -> list[Arm]:
    """Play `rounds` rounds where arm a commits tokens at rates[a] tokens/s (1 s rounds, noisy)."""
    rng = np.random.default_rng(seed)
    played = []
    for _ in range(rounds):
        arm, explored = controller.play(batch)
        tokens = max(0, int(round(rates[arm] * (1.0 + noise * rng.standard_normal()))))
        controller.observe(batch, arm, tokens, 1.0, explored)
        played.append(arm)
    return played


@pytest.mark.parametrize("winner", [Arm.PLAIN, Arm.SPECULATE])
def test_converges_to_the_faster_arm_and_loses_within_the_bound(winner):
    rates = {winner: 100.0, winner.other: 75.0}
    config = DoNoHarmConfig()
    controller = DoNoHarm(config)
    played = run(controller, rates, 600, noise=0.05)
    steady = played[2 * config.warmup:]
    share = sum(a is winner for a in steady) / len(steady)
    assert share >= 1 - 1 / config.explore_every
    committed = sum(rates[a] for a in steady) / len(steady)
    # the stated bound: at most 1/explore_every of the gap to the worse arm (and a little noise)
    assert committed >= 100.0 * (1 - 0.25 / config.explore_every) - 0.5


def test_exploration_backs_off_while_it_keeps_confirming_the_choice():
    controller = DoNoHarm(DoNoHarmConfig(explore_every=4, max_interval=32))
    played = run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 400)
    late = played[200:]
    assert sum(a is Arm.SPECULATE for a in late) <= len(late) / 32 + 1


@pytest.mark.parametrize("before,after", [((150.0, 100.0), (40.0, 100.0)), ((40.0, 100.0), (150.0, 100.0))],
                         ids=["speculation-stops-paying", "speculation-starts-paying"])
def test_follows_a_change_within_a_bounded_number_of_rounds(before, after):
    """Either way: a drop is seen by the arm played, a rise of the other arm by an exploration."""
    config = DoNoHarmConfig()
    controller = DoNoHarm(config)
    rates = [{Arm.SPECULATE: spec, Arm.PLAIN: plain} for spec, plain in (before, after)]
    run(controller, rates[0], 300)
    played = run(controller, rates[1], 300)
    winner = max(Arm, key=lambda a: rates[1][a])
    first_streak = next(i for i in range(len(played) - 10) if all(a is winner for a in played[i:i + 10]))
    # the next exploration (interval <= max_interval) sees the change, and the decayed estimate flips in a few rounds
    assert first_streak <= config.max_interval + 10
    assert sum(a is winner for a in played[-100:]) >= 90


def test_a_controller_that_never_explores_would_miss_speculation_starting_to_pay():
    """Planted fault: without exploration a plain choice is never revisited, which the test above catches."""
    config = DoNoHarmConfig(explore_every=10 ** 6, max_interval=10 ** 6)
    controller = DoNoHarm(config)
    run(controller, {Arm.SPECULATE: 40.0, Arm.PLAIN: 100.0}, 50)
    after = run(controller, {Arm.SPECULATE: 150.0, Arm.PLAIN: 100.0}, 200)
    assert sum(a is Arm.SPECULATE for a in after[-100:]) < 90


@pytest.mark.parametrize("bad", [dict(warmup=0), dict(explore_every=1), dict(explore_every=64, max_interval=32),
                                 dict(decay=1.0), dict(decay=-0.1)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(InputError, match="do-no-harm"):
        DoNoHarmConfig(**bad)


def test_a_batch_of_no_request_is_refused():
    with pytest.raises(InputError, match="at least one request"):
        DoNoHarm().play(0)


def test_an_exploration_burst_plays_the_other_arm_that_many_rounds_and_judges_at_its_end():
    config = DoNoHarmConfig(explore_every=8, explore_rounds=3, warmup=1, decay=0.5, stale=1.0)
    controller = DoNoHarm(config)
    played = run(controller, {Arm.SPECULATE: 100.0, Arm.PLAIN: 50.0}, 40)
    # after the warm-up, speculation is chosen; each exploration is 3 plain rounds in a row
    runs, current = [], 0
    for arm in played[2:]:
        if arm is Arm.PLAIN:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    assert runs and all(n == 3 for n in runs), played


def test_a_stale_arm_keeps_its_past_while_the_other_plays():
    """With stale = 1 the plain arm's estimate stays what it measured while speculation plays;
    with stale = 0 one exploration round alone decides it (what made a short memory noisy)."""
    for stale, expected in ((1.0, 75.0), (0.0, 10.0)):
        controller = DoNoHarm(DoNoHarmConfig(warmup=1, decay=0.9, stale=stale))
        controller.observe(1, Arm.PLAIN, 75, 1.0, False)
        for _ in range(20):
            controller.observe(1, Arm.SPECULATE, 100, 1.0, False)
        controller.observe(1, Arm.PLAIN, 10, 1.0, True)
        estimate = controller.estimates(1)[Arm.PLAIN]
        want = (0.9 * 75 + 10) / 1.9 if stale == 1.0 else expected
        assert estimate == pytest.approx(want)


def test_a_request_joining_makes_the_next_round_explore_and_restarts_the_interval():
    controller = DoNoHarm(DoNoHarmConfig(explore_every=4, max_interval=64))
    played = run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 200, batch=1)
    assert controller._states[1].interval == 64  # explorations kept confirming plain
    controller.joined(1)
    arm, explored = controller.play(1)
    assert (arm, explored) == (Arm.SPECULATE, True)
    assert controller._states[1].interval == 4
    assert played[-1] is Arm.PLAIN
    controller.joined(3)  # a batch size never seen: nothing to restart
    assert 3 not in controller._states


def test_at_batch_b_the_interval_restarts_once_b_requests_have_joined():
    """A join changes 1/B of the batch: the other arm is explored again once the whole batch has
    turned over (B joins) since it was last played, not at every join."""
    controller = DoNoHarm(DoNoHarmConfig(explore_every=4, max_interval=64))
    run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 300, batch=4)
    assert controller._states[4].interval == 64
    for _ in range(3):
        controller.joined(4)
        assert controller.play(4) == (Arm.PLAIN, False)  # 3 of 4 slots changed: no exploration yet
    controller.joined(4)
    assert controller.play(4) == (Arm.SPECULATE, True)
    assert controller._states[4].interval == 4
    controller.observe(4, Arm.SPECULATE, 50, 1.0, True)  # the exploration resets the turnover
    controller.joined(4)
    assert controller._states[4].turnover == pytest.approx(0.25)


def test_while_speculation_is_chosen_a_turnover_forces_no_plain_exploration():
    """A plain step's price does not depend on which requests are in the batch: with speculation
    chosen, a whole turnover leaves the interval as it grew (the speculative rounds measure the
    new requests themselves)."""
    controller = DoNoHarm(DoNoHarmConfig(explore_every=4, max_interval=64))
    run(controller, {Arm.PLAIN: 50.0, Arm.SPECULATE: 100.0}, 300, batch=4)
    assert controller._states[4].interval == 64 and controller.chosen(4) is Arm.SPECULATE
    since = controller._states[4].since_explore
    for _ in range(8):
        controller.joined(4)
    assert controller._states[4].interval == 64 and controller._states[4].since_explore == since
    assert controller.play(4) == (Arm.SPECULATE, False)


def test_an_unseen_batch_size_starts_from_its_nearest_measured_neighbour():
    """A batch shrinking from 8 visits 7, 6, ...: each starts from the nearest measured size's
    estimates (no warm-up of the losing arm), explores the other arm once at once, and then
    follows what it measures itself."""
    controller = DoNoHarm(DoNoHarmConfig(explore_every=8, max_interval=64))
    run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 200, batch=8)
    assert controller.play(7) == (Arm.SPECULATE, True)  # one exploration first
    controller.observe(7, Arm.SPECULATE, 50, 1.0, True)
    played = run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 40, batch=7)
    assert sum(a is Arm.SPECULATE for a in played) <= 40 / 8 + 1  # never the warm-up's two rounds again
    estimates = controller.estimates(7)
    assert estimates[Arm.PLAIN] == pytest.approx(100.0) and estimates[Arm.SPECULATE] == pytest.approx(50.0)
    # the carried estimates weigh as `warmup` rounds: where 7 differs, its own rounds take over
    flipped = run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 200.0}, 120, batch=6)
    assert sum(a is Arm.SPECULATE for a in flipped[-40:]) >= 35


def test_without_a_measured_neighbour_both_arms_warm_up_a_batch_plain_first():
    """A batch warms plain rounds up first (a speculative round puts its requests out of step);
    a request alone speculates first."""
    controller = DoNoHarm(DoNoHarmConfig(warmup=2))
    played = run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 4, batch=3)
    assert played == [Arm.PLAIN, Arm.PLAIN, Arm.SPECULATE, Arm.SPECULATE]
    alone = run(DoNoHarm(DoNoHarmConfig(warmup=2)), {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 4, batch=1)
    assert alone == [Arm.SPECULATE, Arm.SPECULATE, Arm.PLAIN, Arm.PLAIN]


@pytest.mark.parametrize("pays", [False, True])
def test_a_batchs_priced_shadows_warm_speculation_up_without_a_speculative_round(pays):
    """Shadows priced by the caller (the batch profile) count as speculation's warm-up: a batch
    plays plain rounds until they show speculation to pay, and then speculates (chosen, not
    explored).  Planted contrast: without shadows the warm-up plays speculative rounds."""
    controller = DoNoHarm(DoNoHarmConfig(warmup=2))
    played = []
    for _ in range(12):
        arm, explored = controller.play(4)
        played.append((arm, explored))
        if arm is Arm.PLAIN:  # each request's shadow: 3 tokens (pays) or 1 (a plain step and a proposal)
            assert controller.shadow(4, [3 if pays else 1] * 4, seconds=1.2)
        controller.observe(4, arm, 4 if arm is Arm.PLAIN else 12, 1.0 if arm is Arm.PLAIN else 1.2, explored)
    assert (Arm.SPECULATE, True) not in played  # no speculative round to warm up or explore
    if pays:
        first = next(i for i, (arm, _) in enumerate(played) if arm is Arm.SPECULATE)
        assert first <= 3 and all(arm is Arm.SPECULATE for arm, _ in played[first:first + 7])
    else:
        assert all(arm is Arm.PLAIN for arm, _ in played)
    unshadowed = run(DoNoHarm(DoNoHarmConfig(warmup=2)), {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 4, batch=4)
    assert Arm.SPECULATE in unshadowed


def settle_on_plain(controller: DoNoHarm) -> None:
    """Speculation measured at 50 tokens/s, plain at 100: the controller chooses plain."""
    run(controller, {Arm.PLAIN: 100.0, Arm.SPECULATE: 50.0}, 40, batch=1)
    assert controller.play(1)[0] is Arm.PLAIN


def test_shadow_rounds_bring_speculation_back_without_an_exploration():
    """While plain is played, shadow rounds (what a speculative round would have committed there)
    move speculation's estimate: once they show it paying, the next round speculates.  Planted
    contrast: the same controller told nothing stays on plain until its next exploration."""
    told, untold = DoNoHarm(), DoNoHarm()
    for controller in (told, untold):
        settle_on_plain(controller)
    untold_arms, told_arms = [], []
    for _ in range(30):
        for controller, arms in ((told, told_arms), (untold, untold_arms)):
            arm, explored = controller.play(1)
            arms.append((arm, explored))
            if controller is told and arm is Arm.PLAIN:
                assert controller.shadow(1, [300])  # speculation would commit 300 tokens in its mean round (1 s)
            controller.observe(1, arm, 100 if arm is Arm.PLAIN else 300, 1.0, explored)
    first = next(i for i, (arm, _) in enumerate(told_arms) if arm is Arm.SPECULATE)
    assert first <= 2 and not told_arms[first][1]  # chosen, not explored
    assert all(arm is Arm.SPECULATE for arm, _ in told_arms[first:first + 7])  # until plain is next explored
    untold_first = next((i for i, (arm, _) in enumerate(untold_arms) if arm is Arm.SPECULATE), len(untold_arms))
    assert untold_first > first + 2


def test_while_shadows_say_speculation_loses_plain_is_never_interrupted_by_explorations():
    controller = DoNoHarm(DoNoHarmConfig(explore_every=4, max_interval=8))
    settle_on_plain(controller)
    arms = []
    for _ in range(100):
        arm, explored = controller.play(1)
        arms.append(arm)
        controller.shadow(1, [40])
        controller.observe(1, arm, 100 if arm is Arm.PLAIN else 50, 1.0, explored)
    assert all(arm is Arm.PLAIN for arm in arms)


def test_a_shadow_round_is_priced_at_speculations_mean_measured_round_and_ignored_before_one():
    controller = DoNoHarm(DoNoHarmConfig(warmup=1, decay=0.5, stale=1.0))
    assert not controller.shadow(1, [5])  # nothing to price it with
    controller.observe(1, Arm.SPECULATE, 3, 2.0, False)
    assert controller.shadow(1, [7])
    # (0.5 * 3 + 7) / (0.5 * 2 + 2): the shadow counts as a round of 2 s
    assert controller.estimates(1)[Arm.SPECULATE] == pytest.approx(8.5 / 3.0)
    assert controller._states[1].rates[Arm.SPECULATE].rounds == 1  # evidence, not a played round


def test_a_batchs_shadows_count_as_their_share_of_a_batch_round():
    """Two of four requests' shadows (3 and 1 tokens) stand for half a batch round committing
    4 x 2 tokens, at the arm's mean measured batch round."""
    controller = DoNoHarm(DoNoHarmConfig(warmup=1, decay=0.5, stale=1.0))
    controller.observe(4, Arm.SPECULATE, 6, 2.0, False)
    assert controller.shadow(4, [3, 1])
    rate = controller._states[4].rates[Arm.SPECULATE]
    assert rate.weight == pytest.approx(0.5 * 1 + 0.5)
    assert rate.tokens == pytest.approx(0.5 * 6 + 0.5 * 8) and rate.seconds == pytest.approx(0.5 * 2 + 0.5 * 2)
    assert not controller.shadow(4, [])


@pytest.mark.parametrize("winner", [Arm.PLAIN, Arm.SPECULATE])
def test_speculation_is_proven_only_once_both_arms_were_measured_and_it_won(winner):
    """A new batch size starts on PLAIN (a prior, not a measurement); `proven` says yes only
    after both arms' warm-up, and only where speculation measured faster."""
    controller = DoNoHarm()
    assert not controller.proven(4)
    assert controller.chosen(4) is Arm.PLAIN  # the prior
    run(controller, {winner: 100.0, winner.other: 75.0}, 2 * controller.config.warmup - 1)
    assert not controller.proven(4)  # one arm still warming up
    run(controller, {winner: 100.0, winner.other: 75.0}, 20)
    assert controller.proven(4) is (winner is Arm.SPECULATE)
    assert not controller.proven(2)  # measured at 4 only


def test_in_a_batch_speculation_must_win_by_the_margin_and_alone_it_need_not():
    """A speculating arm 2% faster than plain is not chosen in a batch (margin 3%), but is for a
    request alone (no side costs), and one 6% faster is chosen in a batch too."""
    config = DoNoHarmConfig()
    assert config.batch_margin == pytest.approx(0.03)
    for batch, gain, winner in ((4, 1.02, Arm.PLAIN), (1, 1.02, Arm.SPECULATE), (4, 1.06, Arm.SPECULATE)):
        controller = DoNoHarm(config)
        run(controller, {Arm.SPECULATE: 100.0 * gain, Arm.PLAIN: 100.0}, 50, batch=batch)
        assert controller.chosen(batch) is winner, (batch, gain)
    with pytest.raises(InputError, match="batch_margin"):
        DoNoHarmConfig(batch_margin=1.5)


def test_a_next_request_starts_where_the_last_left_off_without_warm_up():
    """`DoNoHarm.carry_alone` (a request joining an empty engine): the choice the last request
    ended on, both arms' estimates carried as `warmup` rounds' worth of evidence, no warm-up rounds; plain chosen reads the prompt without
    candidates.  A previous controller still warming up gives a fresh one."""
    config = DoNoHarmConfig()
    previous = DoNoHarm(config)
    settle_on_plain(previous)
    previous.shadow(1, [1])  # its plain rounds carried shadows
    before = previous.estimates(1)
    following = previous
    following.carry_alone()
    assert following.prompt_arm(1) is Arm.PLAIN
    assert following.estimates(1) == pytest.approx(before)
    rates = following._states[1].rates
    assert all(rate.weight == pytest.approx(config.warmup) for rate in rates.values())
    # shadows again (the same proposers): plain is played with no warm-up and no exploration
    assert [following.play(1) for _ in range(3)] == [(Arm.PLAIN, False)] * 3
    # the new text's own rounds soon outweigh the carried ones: speculation paying flips it
    for _ in range(6):
        arm, explored = following.play(1)
        following.shadow(1, [300])  # speculation here would commit 300 tokens in its 1 s round
        following.observe(1, arm, 100, 1.0, explored)
    assert following.chosen(1) is Arm.SPECULATE
    warming = DoNoHarm(config)
    warming.observe(1, Arm.SPECULATE, 1, 1.0, False)
    never = DoNoHarm(config)
    for fresh in (warming, never):
        fresh.carry_alone()
        assert fresh.prompt_arm(1) is Arm.SPECULATE and fresh.play(1) == (Arm.SPECULATE, False)
        assert fresh._states[1].warming(config.warmup)


def test_shadows_take_a_smaller_share_the_further_speculation_is_behind():
    """The full `shadow_budget` while speculating or within `shadow_close` of plain; in proportion
    beyond (close / gap), never under a quarter of it."""
    config = DoNoHarmConfig(shadow_budget=0.02, shadow_close=0.05)
    for ratio, share in ((0.97, 0.02), (0.9, 0.01), (0.8, 0.005), (0.5, 0.005)):
        controller = DoNoHarm(config)
        run(controller, {Arm.SPECULATE: 100.0 * ratio, Arm.PLAIN: 100.0}, 40, batch=1)
        assert controller.chosen(1) is Arm.PLAIN
        assert controller.shadow_share(1) == pytest.approx(share, rel=0.05), ratio
    speculating = DoNoHarm(config)
    run(speculating, {Arm.SPECULATE: 120.0, Arm.PLAIN: 100.0}, 40, batch=1)
    assert speculating.shadow_share(1) == 0.02 and DoNoHarm(config).shadow_share(1) == 0.02
    with pytest.raises(InputError, match="shadow_close"):
        DoNoHarmConfig(shadow_close=0.0)


def test_what_a_speculative_round_leaves_to_the_next_plain_round_is_charged_to_speculation():
    """A plain round right after a speculative one takes 1.5 s where plain rounds take 1 s: the
    0.5 s is speculation's (llama.cpp rebuilds its graph for the one-row shape), so plain's
    estimate stays at its own rounds' rate and speculation's pays the excess.  Planted contrast:
    the same excess after a plain round stays plain's."""
    config = DoNoHarmConfig(warmup=1, decay=0.5, stale=1.0)
    controller = DoNoHarm(config)
    controller.observe(1, Arm.PLAIN, 1, 1.0, False)
    controller.observe(1, Arm.SPECULATE, 3, 2.0, False)
    controller.observe(1, Arm.PLAIN, 1, 1.5, True)
    plain, speculate = (controller._states[1].rates[arm] for arm in (Arm.PLAIN, Arm.SPECULATE))
    assert plain.mean_seconds == pytest.approx(1.0)
    assert speculate.seconds == pytest.approx(2.5) and speculate.tokens == pytest.approx(3.0)
    assert controller.ledger[-1].seconds == pytest.approx(1.5)  # the ledger keeps what the round took
    contrast = DoNoHarm(config)
    for arm, tokens, seconds in ((Arm.SPECULATE, 3, 2.0), (Arm.PLAIN, 1, 1.0), (Arm.PLAIN, 1, 1.5)):
        contrast.observe(1, arm, tokens, seconds, False)
    plain = contrast._states[1].rates[Arm.PLAIN]
    assert plain.seconds == pytest.approx(0.5 * 1.0 + 1.5)
    assert contrast._states[1].rates[Arm.SPECULATE].seconds == pytest.approx(2.0)
