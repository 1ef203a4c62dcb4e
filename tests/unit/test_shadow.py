"""Shadow proposals (`draftwise.runtime.shadow`): the accepted length read off published tokens is the
one the greedy and membership verifiers select, and shadows keep within their time budget."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.shadow import ShadowOutcome, ShadowRounds, accepted_along
from draftwise.topology.compile import compile_round
from draftwise.verify.base import NumpyLogits
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier
from tests.helpers import result_from_paths

V = 5


def random_round(rng: np.random.Generator):
    paths = [[int(t) for t in rng.integers(0, V, size=rng.integers(1, 5))] for _ in range(rng.integers(1, 5))]
    return compile_round(10, [result_from_paths(paths)])


def published_by(round_, logits: np.ndarray, rng: np.random.Generator) -> list[int]:
    """The tokens a greedy target publishes from this point: its argmax at the frontier, then at
    each row it reaches, and past the tree's end tokens from the rest of the text (random)."""
    published, row = [], -1
    while True:
        token = int(np.argmax(logits[row + 1]))
        published.append(token)
        match = next((r for r in round_.children_of(row) if int(round_.token_ids[r]) == token), None)
        if match is None:
            return published + [int(t) for t in rng.integers(0, V, size=3)]
        row = match


@pytest.mark.parametrize("seed", range(40))
def test_the_length_read_off_the_published_tokens_is_the_greedy_verifiers(seed):
    rng = np.random.default_rng(seed)
    round_ = random_round(rng)
    # a target that mostly follows the tree (so deep accepts happen), sometimes not
    logits = rng.normal(size=(1 + round_.n, V)).astype(np.float32)
    for row in [-1, *range(round_.n)]:
        children = round_.children_of(row)
        if children and rng.random() < 0.7:
            logits[row + 1, int(round_.token_ids[children[rng.integers(len(children))]])] += 10.0
    selection = GreedyVerifier().select(round_, NumpyLogits(logits), SamplingPolicy(), np.random.default_rng(0))
    published = published_by(round_, logits, rng)
    assert accepted_along(round_, published) == len(selection.accepted_rows)
    assert published[len(selection.accepted_rows)] == selection.bonus_token


@pytest.mark.parametrize("seed", range(20))
def test_membership_accepts_exactly_the_rows_the_sampled_tokens_walk(seed):
    """At temperature 1 the membership verifier accepts a child iff it is the target's draw: the
    tokens it publishes walk the tree exactly as far as it accepted."""
    rng = np.random.default_rng(seed)
    round_ = random_round(rng)
    logits = rng.normal(size=(1 + round_.n, V)).astype(np.float32)
    selection = MembershipVerifier().select(round_, NumpyLogits(logits), SamplingPolicy(temperature=1.0),
                                            np.random.default_rng(seed))
    published = [int(round_.token_ids[r]) for r in selection.accepted_rows] + [selection.bonus_token]
    assert accepted_along(round_, published) == len(selection.accepted_rows)


def test_a_length_waits_for_enough_tokens_and_a_leaf_needs_no_more():
    round_ = compile_round(10, [result_from_paths([[1, 2, 3], [1, 4]])])
    assert accepted_along(round_, []) is None
    assert accepted_along(round_, [1]) is None  # 1 matched: is the next 2, 4 or neither?
    assert accepted_along(round_, [1, 4]) == 2  # a leaf: nothing deeper to wait for
    assert accepted_along(round_, [1, 2]) is None
    assert accepted_along(round_, [1, 2, 0]) == 2
    assert accepted_along(round_, [0]) == 0


def test_pending_shadows_resolve_in_order_of_what_the_text_decides():
    shadows = ShadowRounds(budget=1.0)
    first = compile_round(10, [result_from_paths([[7, 8, 9]])])  # made before token 0 was published
    second = compile_round(11, [result_from_paths([[8]])])  # made before token 1
    empty = compile_round(12, [result_from_paths([])])  # nothing proposed before token 2
    shadows.track(0, first, 0.003, 1.0)
    shadows.track(1, second, 0.001, 1.0)
    shadows.track(2, empty, 0.002, 1.0)
    # the first still matches, the second has not seen its token; an empty proposal commits 1 at once
    assert shadows.resolve([7]) == [ShadowOutcome(1, 0, 0.002)]
    assert shadows.resolve([7, 8]) == [ShadowOutcome(2, 1, 0.001)]  # the second's leaf matched: 1 + the target's
    assert shadows.resolve([7, 8, 3]) == [ShadowOutcome(3, 3, 0.003)]  # wanted 9 at token 2: 2 accepted + 1
    assert shadows.resolve([7, 8, 3, 1]) == []  # nothing left


# (the budget a shadow is tracked with, rounds of 30 that carry one): the generation's 2%, every
# third round (1.5 ms per 3 x 35 ms); a quarter of it given per shadow, every 9th round
@pytest.mark.parametrize("budget, shadowed", [(None, 10), (0.005, 4)])
def test_shadows_are_spaced_to_keep_their_cost_within_the_budget(budget, shadowed):
    shadows = ShadowRounds(budget=0.02)
    round_ = compile_round(10, [result_from_paths([[1]])])
    due = []
    for _ in range(30):
        is_due = shadows.due()
        due.append(is_due)
        if is_due:  # heads-like: 4% of a step
            shadows.track(0, round_, cost=0.0015, plain_seconds=0.035, budget=budget)
    assert sum(due) == shadowed
    cheap = ShadowRounds(budget=0.02)
    for _ in range(5):
        assert cheap.due()
        cheap.track(0, round_, cost=0.0001, plain_seconds=0.035)  # prompt lookup: every round


def test_a_shadow_is_priced_by_its_own_rows_on_the_profile():
    """With a profile, a shadow round costs its proposal plus a plain round scaled by t(1 + rows):
    an empty proposal a plain round, a long one what its rows cost where rows are dear; in a batch
    of B, every request's proposal and t_B.  Without one, an empty proposal costs a plain round
    and its proposals, and a proposal with rows the arm's mean (None)."""
    from draftwise.runtime.guard import Arm, DoNoHarm, DoNoHarmConfig
    from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
    from draftwise.runtime.strategy import RoundStrategy
    from draftwise.runtime.shadow import ShadowOutcome

    harm = DoNoHarm(DoNoHarmConfig(warmup=1))
    profile = VerifyCostProfile(rows=(1, 4, 11), relative=(1.0, 1.5, 2.5), absolute_s=None, model="m", backend="b",
                                threads=1, machine="x")
    priced, unpriced = RoundStrategy(harm, BatchCostProfile({1: profile})), RoundStrategy(harm)
    assert priced.shadow_price(ShadowOutcome(1, 0, 0.0), 1) is None  # no plain round measured yet
    harm.observe(1, Arm.PLAIN, 1, 0.010, False)
    harm.observe(2, Arm.PLAIN, 2, 0.020, False)
    assert priced.shadow_price(ShadowOutcome(1, 0, 0.001), 1) == pytest.approx(0.011)
    assert priced.shadow_price(ShadowOutcome(4, 10, 0.001), 1) == pytest.approx(0.001 + 0.025)
    assert priced.shadow_price(ShadowOutcome(4, 30, 0.0), 1) == pytest.approx(0.025)  # no more than measured
    assert priced.shadow_price(ShadowOutcome(4, 3, 0.001), 2) == pytest.approx(2 * 0.001 + 0.030)
    assert unpriced.shadow_price(ShadowOutcome(1, 0, 0.001), 1) is None  # no speculative round to weigh it against
    harm.observe(1, Arm.SPECULATE, 3, 0.020, False)
    harm.observe(2, Arm.SPECULATE, 6, 0.040, False)
    assert unpriced.shadow_price(ShadowOutcome(1, 0, 0.001), 1) == pytest.approx(0.011)
    assert unpriced.shadow_price(ShadowOutcome(1, 0, 0.001), 2) == pytest.approx(0.022)
    assert unpriced.shadow_price(ShadowOutcome(3, 5, 0.001), 1) is None
