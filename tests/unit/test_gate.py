"""The cost gate: its acceptance estimate, its depth choice against hand-written profiles, and
what it learns from a round (including the candidates it cut)."""

import pytest

from draftwise.runtime.gate import CostGate, CostGateConfig, gate_round, rows_within_depths
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.topology.compile import TreeLimits, compile_round, cut_to_depth
from tests.helpers import result_from_paths


def profile(relative):
    rows = tuple(range(1, len(relative) + 1))
    return VerifyCostProfile(rows=rows, relative=tuple(relative), absolute_s=None, model="m", backend="b",
                             threads=2, machine="test")


STEP = profile([1.0] + [3.3] * 20)  # transformers on this CPU: one row cheap, many rows ~3.3 steps
FLAT = profile([1.0] * 21)


def gate(p=STEP, **rates):
    return CostGate(CostGateConfig(p, **rates))


def test_expected_accepted_is_the_chain_sum():
    g = gate(prior_first=0.5, prior_continue=0.8)
    assert g.expected_accepted(0) == 0.0
    assert g.expected_accepted(3) == pytest.approx(0.5 + 0.5 * 0.8 + 0.5 * 0.8 ** 2)


def test_step_profile_takes_a_plain_step_unless_acceptance_pays_for_the_wide_round():
    rows = list(range(11))  # a 10-token chain
    # E[accepted | 10] = 0.5 * (1 - 0.8^10) / 0.2 = 2.23: 3.23 tokens for 3.3 steps < 1 token per step
    assert gate(prior_first=0.5, prior_continue=0.8).choose(rows) == 0
    # E = 0.9 * (1 - 0.9^10) / 0.1 = 5.76: 6.76 / 3.3 > 1, and deeper is always better on a flat step
    assert gate(prior_first=0.9, prior_continue=0.9).choose(rows) == 10


def test_flat_profile_never_cuts_a_proposal_worth_anything():
    assert gate(FLAT, prior_first=0.05, prior_continue=0.05).choose(list(range(11))) == 10


def test_linear_profile_stops_where_the_next_depth_no_longer_pays():
    linear = profile([1.0 + 0.25 * (n - 1) for n in range(1, 21)])
    g = gate(linear, prior_first=0.9, prior_continue=0.6)
    best = g.choose(list(range(11)))
    rates = [(1 + g.expected_accepted(d)) / linear.relative_at(1 + d) for d in range(11)]
    assert best == max(range(11), key=lambda d: (rates[d], -d))
    assert 0 < best < 10


def test_depths_beyond_the_measured_rows_are_never_chosen():
    short = profile([1.0, 1.0, 1.0])  # rows 1..3 measured: at most 2 candidate rows
    assert gate(short, prior_first=0.99, prior_continue=0.99).choose(list(range(11))) == 2


def test_tree_rows_count_every_candidate_within_the_depth():
    round_ = compile_round(5, [result_from_paths([[1, 2, 3], [1, 4], [5]])], TreeLimits())
    assert rows_within_depths(round_, 3) == [0, 2, 4, 5]
    # three depth-1..2 rows cost what t(5) says, not t(3)
    costly_wide = profile([1.0, 1.0, 1.0, 5.0, 5.0, 5.0])
    assert gate(costly_wide, prior_first=0.9, prior_continue=0.9).choose(rows_within_depths(round_, 3)) == 1


def test_gate_round_cuts_the_offered_round_at_the_chosen_depth():
    results = [result_from_paths([[1, 2, 3], [1, 4], [5]])]
    offered = compile_round(5, results, TreeLimits())
    costly_wide = profile([1.0, 1.0, 1.0, 5.0, 5.0, 5.0])  # as above: depth 1 is the best buy
    cut, gated = gate_round(gate(costly_wide, prior_first=0.9, prior_continue=0.9), offered, reads_prompt=False)
    assert gated
    assert cut.token_ids.tolist() == compile_round(5, results, TreeLimits(TreeLimits().max_nodes, 1)).token_ids.tolist()
    assert sorted(cut.token_ids.tolist()) == [1, 5] and int(cut.depth.max()) == 1


def test_the_cut_round_holds_exactly_the_rows_the_gate_priced():
    """Near the end of the context the node budget cut the offered round; a recompile at a
    shallower depth would let in nodes of later candidates that the budget had cut (the
    depth-cut ones take no budget), rows the gate never priced.  The cut keeps only offered rows."""
    results = [result_from_paths([[1, 2, 3, 4], [5, 6, 7, 8]])]
    offered = compile_round(5, results, TreeLimits(max_nodes=4, max_depth=16))  # candidate 1 only
    assert offered.token_ids.tolist() == [1, 2, 3, 4]
    cut = cut_to_depth(offered, 2)
    assert cut.token_ids.tolist() == [1, 2] and rows_within_depths(offered, 4)[2] == cut.n
    assert compile_round(5, results, TreeLimits(max_nodes=4, max_depth=2)).n == 4  # what a recompile let in
    # the kept rows keep their structure: parents, masks, where every input node landed
    assert cut.parent.tolist() == [-1, 0] and cut.ancestor_mask.tolist() == [[True, False], [True, True]]
    assert cut.origin == ((0, 1, -2, -2, -2, -2, -2, -2),)
    # and gate_round returns that cut: depth 2 is the best buy on this profile
    two_deep = profile([1.0, 1.0, 1.0, 9.0, 9.0])
    gated, was_cut = gate_round(gate(two_deep, prior_first=0.9, prior_continue=0.9), offered, reads_prompt=False)
    assert was_cut and gated.token_ids.tolist() == [1, 2]


def test_gate_round_leaves_the_prompt_round_an_absent_gate_and_an_uncut_choice_alone():
    results = [result_from_paths([[1, 2, 3]])]
    offered = compile_round(5, results, TreeLimits())
    closed = gate(prior_first=0.01, prior_continue=0.01)  # STEP profile: would take a plain step
    assert gate_round(closed, offered, reads_prompt=True) == (offered, False)
    assert gate_round(None, offered, reads_prompt=False) == (offered, False)
    assert gate_round(gate(FLAT, prior_first=0.9), offered, reads_prompt=False) == (offered, False)
    plain, gated = gate_round(closed, offered, reads_prompt=False)
    assert gated and plain.n == 0  # depth 0: an ordinary target step


def test_observe_walks_the_published_tokens_down_the_full_proposal():
    round_ = compile_round(5, [result_from_paths([[7, 8, 9]])], TreeLimits())
    g = gate(prior_first=0.5, prior_continue=0.5, prior_weight=1.0, decay=0.0)
    g.observe(round_, [7, 8, 4])  # depth 1 and 2 right, depth 3 wrong
    assert (g.first.successes, g.first.trials) == (0.5 + 1, 1 + 1)
    assert (g.further.successes, g.further.trials) == (0.5 + 1, 1 + 2)


def test_the_target_token_after_a_cut_is_evidence_and_deeper_cut_rows_are_censored():
    round_ = compile_round(5, [result_from_paths([[7, 8, 9, 10]])], TreeLimits())
    g = gate(prior_first=0.5, prior_continue=0.5, decay=0.0)
    g.observe(round_, [7, 8])  # cut at depth 1: 7 accepted, the target's bonus 8 equals the cut depth-2 row
    assert (g.first.successes, g.first.trials) == (1.5, 2)
    assert (g.further.successes, g.further.trials) == (1.5, 2)  # depths 3, 4: unobserved, not rejected


def test_a_plain_step_still_learns_whether_the_first_candidate_was_right():
    round_ = compile_round(5, [result_from_paths([[7, 8], [6]])], TreeLimits())
    g = gate(prior_first=0.5, prior_continue=0.5, decay=0.0)
    g.observe(round_, [6])  # gated to depth 0; the target chose 6, one of the depth-1 candidates
    assert (g.first.successes, g.first.trials) == (1.5, 2)
    g.observe(round_, [3])
    assert (g.first.successes, g.first.trials) == (0.5, 2)  # decay 0: the earlier round is forgotten


def test_a_proposal_that_ends_teaches_nothing_about_deeper_rows():
    round_ = compile_round(5, [result_from_paths([[7]])], TreeLimits())
    g = gate(prior_first=0.5, prior_continue=0.5, decay=0.0)
    g.observe(round_, [7, 3])
    assert g.further.trials == 1.0


def test_without_evidence_the_estimate_decays_back_to_the_prior():
    round_ = compile_round(5, [result_from_paths([[7, 8]])], TreeLimits())
    g = gate(prior_first=0.5, prior_continue=0.8, decay=0.5)
    for _ in range(8):
        g.observe(round_, [1])
    # steady state of all-wrong rounds: prior 0.5 / (1 + 1 / (1 - decay)) = 0.167
    assert g.first.rate == pytest.approx(0.5 / 3, abs=0.01)
    for _ in range(40):
        g.observe(None, [1])
    assert g.first.rate == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("bad", [dict(decay=1.0), dict(decay=-0.1), dict(walk_decay=1.0), dict(prior_first=1.5),
                                 dict(prior_weight=0.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        CostGateConfig(STEP, **bad)


def test_a_cut_walk_continues_into_the_next_rounds_tokens():
    round_ = compile_round(5, [result_from_paths([[7, 8, 9]])], TreeLimits())
    g = gate(prior_first=0.5, prior_continue=0.5, decay=1e-9)
    g.observe(round_, [7])  # plain step: the target's token equals the first candidate
    g.observe(None, [8])  # the next plain step's token equals the second
    assert (g.further.successes, g.further.trials) == pytest.approx((1.5, 2))
    g.observe(None, [5, 6])  # the third candidate (9) would have been rejected; the walk closes
    assert (g.further.successes, g.further.trials) == pytest.approx((0.5, 2))  # decay ~0: only the last round counts
    g.observe(None, [9])
    assert g.further.trials == pytest.approx(1)  # closed: nothing more is counted


LINEAR = profile([float(n) for n in range(1, 22)])  # every row costs a full step: a compute-bound batch


def test_in_a_batch_the_gate_prices_rows_by_the_batch_sizes_profile():
    from draftwise.runtime.cost_profile import BatchCostProfile

    batches = BatchCostProfile({1: FLAT, 4: STEP, 8: LINEAR})
    g = CostGate(CostGateConfig(FLAT, prior_first=0.9, prior_continue=0.9, batch_profile=batches))
    rows = list(range(11))
    chosen = {}
    for size in (1, 2, 4, 6, 8, 16):
        g.batch = size
        chosen[size] = g.choose(rows)
    # 1-3: priced by B = 1 (flat: verify it all); 4-7 by B = 4's step (6.76 tokens / 3.3 > 1: all);
    # 8 and up by the linear profile: 1 + E[accepted | d] < 1 + d, so a plain batched step
    assert chosen == {1: 10, 2: 10, 4: 10, 6: 10, 8: 0, 16: 0}
    g.batch = 1
    assert CostGate(CostGateConfig(LINEAR, prior_first=0.9, prior_continue=0.9)).choose(rows) == 0  # planted: it matters


def test_a_batch_profile_round_trips_and_refuses_tampering(tmp_path):
    from draftwise.runtime.cost_profile import BatchCostProfile
    from draftwise.errors import ArtifactError

    batches = BatchCostProfile({1: FLAT, 8: LINEAR})
    batches.save(tmp_path / "p")
    loaded = BatchCostProfile.load(tmp_path / "p")
    assert sorted(loaded.by_batch) == [1, 8] and loaded.at(8).relative == LINEAR.relative
    assert loaded.at(5).relative == FLAT.relative and loaded.at(100).relative == LINEAR.relative
    data = tmp_path / "p" / "batch_verify_profile.json"
    data.write_text(data.read_text().replace("21.0", "2.0"))
    with pytest.raises(ArtifactError):
        BatchCostProfile.load(tmp_path / "p")


# ---- the per-source gate of a heterogeneous round --------------------------------------------
def union_round(lookup_paths, heads_paths, prefix_len=10):
    """A merged round of a 'lookup' and a 'heads' proposal (sources 0 and 1)."""
    return compile_round(prefix_len, [result_from_paths(lookup_paths, source="lookup"),
                                      result_from_paths(heads_paths, source="heads")], TreeLimits())


def source_gate(p=profile([1.0, 1.05, 1.1, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7]), **rates):
    from draftwise.runtime.gate import SourceGate

    return SourceGate(CostGateConfig(p, **rates), 2)


def test_the_union_expectation_tries_the_likelier_source_first_then_the_other():
    g = source_gate()
    for k, (h1, hc) in enumerate([(0.2, 0.9), (0.6, 0.5)]):
        g.gates[k].first.successes, g.gates[k].first.trials = h1, 1.0
        g.gates[k].further.successes, g.gates[k].further.trials = hc, 1.0
    heads_two = 0.6 + 0.6 * 0.5
    assert g.expected_union([0, 2]) == pytest.approx(heads_two)
    assert g.expected_union([3, 2]) == pytest.approx(heads_two + (1 - 0.6) * (0.2 + 0.2 * 0.9 + 0.2 * 0.81))
    assert g.expected_union([0, 0]) == 0.0


def test_a_source_whose_rows_keep_missing_is_cut_while_the_other_keeps_its_rows():
    """Lookup's 5-token chain never matches, the heads' first token always does: the per-source
    gate stops verifying lookup's rows and keeps the heads'.  A pooled gate (one model for the
    merged tree, cut by depth) cannot: it keeps or cuts depth 1 of both (the planted contrast)."""
    offered = union_round([[1, 2, 3, 4, 5]], [[7, 8], [9]])  # lookup: 5 rows; heads: 3 rows (7, 7-8, 9)
    g = source_gate()
    pooled = CostGate(CostGateConfig(g.config.profile))
    for _ in range(12):  # the target publishes 7, 8 then its own token every round
        g.observe(offered, [7, 8, 6])
        pooled.observe(offered, [7, 8, 6])
    cut, was_cut = gate_round(g, offered, reads_prompt=False)
    assert was_cut and g._depths[0] == 0 and g._depths[1] >= 1
    kept = {int(t) for t in cut.token_ids}
    assert kept.isdisjoint({1, 2, 3, 4, 5}) and 7 in kept
    pooled_cut, _ = gate_round(pooled, offered, reads_prompt=False)
    assert {1, 7} <= {int(t) for t in pooled_cut.token_ids} or not pooled_cut.n  # by depth: both or neither


def test_a_row_both_sources_proposed_stays_while_either_keeps_it():
    offered = union_round([[7, 2, 3]], [[7, 8]])  # 7 merged: lookup's first and the heads' first
    g = source_gate()
    for _ in range(12):
        g.observe(offered, [7, 8, 6])  # lookup's second token (2) always misses; the heads' 8 hits
    cut, _ = gate_round(g, offered, reads_prompt=False)
    assert [int(t) for t in cut.token_ids] == [7, 8]  # lookup cut below the merged row, heads whole
    assert g.expected_accepted(1) <= g.expected_accepted(2)  # a batch's deeper cut is priced too


def test_a_round_that_reads_the_prompt_is_left_whole_and_one_source_is_no_union():
    from draftwise.errors import InputError
    from draftwise.runtime.gate import SourceGate

    offered = union_round([[1, 2]], [[3]])
    assert gate_round(source_gate(), offered, reads_prompt=True) == (offered, False)
    with pytest.raises(InputError, match="two or more"):
        SourceGate(CostGateConfig(FLAT), 1)


def test_rows_two_sources_proposed_are_priced_once():
    """Lookup's chain runs on past the heads' (7, 8 shared, 9 its own): verifying both whole is
    four rows, within a profile measured to four.  Priced as the sum of each source's rows (six)
    it could never be chosen (the planted contrast: the old upper bound)."""
    offered = union_round([[7, 8, 9]], [[7, 8]])
    g = source_gate(profile([1.0, 1.02, 1.04, 1.06]))
    for _ in range(8):
        g.observe(offered, [7, 8, 9, 6])
    cut, was_cut = gate_round(g, offered, reads_prompt=False)
    assert not was_cut and cut.n == 3 and g._depths[0] == 3
    assert sum(len(rows) for rows in ([7, 8, 9], [7, 8])) + 1 > g.profile.max_rows  # the contrast


def test_a_source_that_only_agrees_with_the_other_is_not_verified_for_its_agreement():
    """Half the rounds both sources propose the right 7, 8 (one merged chain); the other half
    each proposes its own wrong chain.  Taken as independent alternatives, lookup (h1 = 0.5) adds
    a second chance where the heads miss and its two rows are kept; the walks show it never
    committed anything the heads had not, so its rows are cut where they are its own."""
    agree, differ = union_round([[7, 8]], [[7, 8]]), union_round([[1, 2]], [[3, 4]])
    g = source_gate(profile([1.0, 1.05, 1.05, 1.1, 1.2, 1.3]))
    for _ in range(10):
        g.observe(agree, [7, 8, 6])
        g.observe(differ, [5])
    from draftwise.runtime.union_walks import UnionWalks

    walks = g.walks
    assert gate_round(g, differ, reads_prompt=False)[0].token_ids.tolist() == [3, 4]
    g.walks = UnionWalks(2, g.config.walk_decay)  # the planted contrast: the independent model alone keeps lookup's rows
    assert sorted(gate_round(g, differ, reads_prompt=False)[0].token_ids.tolist()) == [1, 2, 3, 4]
    g.walks = walks
    import numpy as np

    walked, _ = g.walks.expected(np.array([[2, 2], [0, 2]]), present=0b11)
    assert walked[0] == pytest.approx(walked[1])  # lookup committed nothing the heads did not


def test_union_walks_record_owners_continue_into_later_tokens_and_serve_their_sources_subsets():
    from draftwise.runtime.union_walks import UnionWalks

    import numpy as np

    offered = union_round([[7, 8, 9]], [[7, 4]])  # 7 both, 8-9 lookup's, 4 the heads'
    own = [np.asarray(offered.origin[k]) for k in range(2)]
    masks = [np.zeros(offered.n, dtype=bool) for _ in range(2)]
    for k in range(2):
        masks[k][[r for r in own[k] if r >= 0]] = True
    walks = UnionWalks(2, decay=0.5)
    walks.observe(offered, masks, [7])  # a round cut to depth 1: the walk stays open at 7
    walks.observe(None, None, [8, 9])  # the next round's tokens take it to lookup's depth 3
    assert walks.walks[0].owners == [0b11, 0b01, 0b01] and walks.walks[0].weight == 0.5
    depths = np.array([[0, 0], [1, 0], [0, 2], [3, 0], [2, 1]])
    expected, weight = walks.expected(depths, present=0b11)
    assert expected.tolist() == [0, 1, 1, 3, 2] and weight == 0.5
    # a round where the heads alone propose is estimated from every round they proposed in,
    # lookup's rows left out: the heads own depth 1 only
    assert walks.expected(np.array([[0, 2]]), present=0b10) == ([1.0], 0.5)
    lookup_alone = union_round([[7, 8]], [])
    walks.observe(lookup_alone, [np.ones(2, dtype=bool), np.zeros(2, dtype=bool)], [7, 8, 5])
    assert walks.expected(depths, present=0b11)[1] == 0.25  # a round without the heads says nothing of theirs
    expected, weight = walks.expected(np.array([[2, 0]]), present=0b01)
    assert weight == 1.25 and expected[0] == pytest.approx((0.25 * 2 + 1.0 * 2) / 1.25)
    from draftwise.runtime.union_walks import MAX_WALKS

    for _ in range(MAX_WALKS + 2):
        walks.observe(offered, masks, [5])  # rounds whose proposals all missed
    assert len(walks.walks) == MAX_WALKS and walks.expected(depths, present=0b11)[0].tolist() == [0] * 5
