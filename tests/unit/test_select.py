"""Hardware profile, tree selection (the design's toy oracle, exactly) and the tree artifact."""

from __future__ import annotations

import json

import pytest

from draftwise.artifacts import ArtifactError, read_manifest, write_manifest
from draftwise.optimize.acceptance import AcceptanceProfile, selected_child_probs
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.select import (FLAT_DRAFT_MODEL, PROFILED_DRAFT_MODEL, draft_round_steps, load_tree_artifact,
                                       optimize_tree, save_tree_artifact)
from draftwise.optimize.sequoia_dp import solve
from draftwise.optimize.sequoia_dp import brute_force, expected_tokens

TOY_H = [0.82, 0.48, 0.24]
TOY_T = dict(zip(range(2, 9), [1.00, 1.03, 1.08, 1.16, 1.28, 1.43, 1.62]))
TOY_C = 0.09


def toy_choice(c: float = TOY_C):
    return optimize_tree(selected_child_probs(TOY_H), TOY_T.__getitem__, c, range(2, 9), 4)


def toy_profile() -> VerifyCostProfile:
    return VerifyCostProfile(rows=tuple(TOY_T), relative=tuple(TOY_T.values()), absolute_s=None,
                             model="toy", backend="none", threads=2, machine="paper")


# ----------------------------------------------------------------------------- toy oracle


def test_toy_oracle_exact():
    choice = toy_choice()
    assert (choice.n, choice.d) == (5, 4)
    assert choice.paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))  # five-node chain
    assert choice.expected_tokens == pytest.approx(3.49588976, rel=0, abs=1e-12)
    assert choice.time_per_token == pytest.approx((1.16 + 4 * 0.09) / 3.49588976, rel=0, abs=1e-12)
    assert round(choice.time_per_token, 4) == 0.4348
    assert choice.speedup == pytest.approx(1 / choice.time_per_token)


def test_toy_grid_is_complete_and_optimum_is_minimum():
    choice = toy_choice()
    assert len(choice.grid) == 7 * 5  # n = 2..8, d = 0..4
    feasible = [g for g in choice.grid if g.expected_tokens is not None]
    assert all(g.time_per_token >= choice.time_per_token for g in feasible)
    assert all(g.expected_tokens is None for g in choice.grid if g.d == 0)  # n >= 2 needs depth
    # Every feasible grid point agrees with brute force over all trees of that budget.
    p = selected_child_probs(TOY_H)
    for g in feasible:
        if g.n <= 7:
            assert g.expected_tokens == pytest.approx(brute_force(p, g.n, g.d)[0], abs=1e-12)
        assert g.time == pytest.approx(TOY_T[g.n] + g.d * TOY_C)


def test_expensive_drafting_prefers_shallow_trees():
    cheap, dear = toy_choice(0.0), toy_choice(1.0)
    assert dear.d < cheap.d
    assert dear.d == 1
    assert expected_tokens(selected_child_probs(TOY_H), dear.paths) == pytest.approx(dear.expected_tokens)


def test_plain_decoding_wins_when_nothing_is_accepted():
    choice = optimize_tree([0.01, 0.005], lambda n: float(n), 0.5, range(1, 6), 3)
    assert (choice.n, choice.d, choice.paths) == (1, 0, ())
    assert choice.speedup == pytest.approx(1.0)


def test_optimize_refuses_bad_inputs():
    p = selected_child_probs(TOY_H)
    with pytest.raises(ValueError):
        optimize_tree(p, TOY_T.__getitem__, -0.1, range(2, 9), 4)
    with pytest.raises(ValueError):
        optimize_tree(p, TOY_T.__getitem__, 0.1, [], 4)
    with pytest.raises(ValueError):
        optimize_tree(p, lambda n: 0.0, 0.1, range(2, 4), 2)
    with pytest.raises(ValueError):
        optimize_tree(p, TOY_T.__getitem__, 0.1, range(6, 9), 1)  # width 3: no tree fits
    with pytest.raises(ValueError):
        optimize_tree(TOY_H, TOY_T.__getitem__, 0.1, range(2, 9), 4)  # h, not p


def test_profile_callable_plugs_in():
    choice = optimize_tree(selected_child_probs(TOY_H), toy_profile().relative_at, TOY_C, range(2, 9), 4)
    assert choice == toy_choice()


# ----------------------------------------------------------------------------- drafting priced by the draft's profile


@pytest.mark.parametrize("paths, tokens, rows", [
    ((), 2.0, []),  # no tree: nothing drafted
    (((0,), (1,), (2,)), 1.8, [1.8]),  # one level: the catch-up forward alone (it gives level 1's q)
    (((0,), (0, 0), (0, 0, 0)), 2.5, [3.5, 2, 1]),  # chain: catch-up + pending, then one row per level
    (((0,), (1,), (0, 0), (1, 0), (1, 1)), 2.0, [3.0, 3]),  # level 2 re-reads the pending row and level 1
    (((0,), (1,), (0, 0), (0, 0, 0), (0, 0, 1)), 0.2, [1.2, 3, 1]),  # catch-up of fewer than one row: one
])
def test_draft_round_steps_counts_the_forwards_the_proposer_runs(paths, tokens, rows):
    forwards: list[float] = []
    cost = draft_round_steps(paths, tokens, lambda r: forwards.append(r) or 0.5 * r + 0.1)
    assert forwards == pytest.approx([max(1.0, r) for r in rows])
    assert cost == pytest.approx(sum(0.5 * max(1.0, r) + 0.1 for r in rows))


def test_the_catch_up_is_priced_by_its_own_profile():
    paths = ((0,), (1,), (0, 0), (1, 0), (1, 1))  # catch-up of G + 1 rows, then level 2 over 3 rows
    verifies, extends = [], []
    cost = draft_round_steps(paths, 2.0, lambda r: verifies.append(r) or r, lambda r: extends.append(r) or 0.1 * r)
    assert extends == [3.0] and verifies == [3] and cost == pytest.approx(0.3 + 3)


def test_optimize_prices_each_grid_tree_by_its_forwards():
    p = selected_child_probs(TOY_H)
    per_row = lambda r: 0.3 * r  # noqa: E731  a compute-bound draft: rows cost linearly
    choice = optimize_tree(p, TOY_T.__getitem__, 123.0, range(2, 9), 4, draft_forward=per_row)
    table = solve(p, 8, 4)
    feasible = [g for g in choice.grid if g.expected_tokens is not None]
    for g in feasible:
        assert g.time == pytest.approx(TOY_T[g.n] + draft_round_steps(table.paths(g.n, g.d), g.expected_tokens, per_row))
    assert choice.draft_model == PROFILED_DRAFT_MODEL and toy_choice().draft_model == FLAT_DRAFT_MODEL
    assert all(g.time_per_token >= choice.time_per_token for g in feasible)  # c = 123 was not used


# ----------------------------------------------------------------------------- hardware profile


def test_interpolation_piecewise_linear_through_the_medians():
    prof = VerifyCostProfile(rows=(1, 2, 4, 8), relative=(1.0, 1.6, 1.5, 3.7), absolute_s=(0.02, 0.032, 0.03, 0.074),
                             model="m", backend="llamacpp", threads=2, machine="x86_64")
    assert prof.relative_at(1) == 1.0
    assert prof.relative_at(1.5) == pytest.approx(1.3)
    assert prof.relative_at(3) == pytest.approx(1.55)
    assert prof.relative_at(4) == pytest.approx(1.5)  # a measured dip (llama.cpp row batching) is kept
    assert prof.relative_at(6) == pytest.approx(1.5 + (3.7 - 1.5) / 2)
    assert prof.absolute_at(2) == pytest.approx(0.032)
    assert prof.absolute_at(4) == pytest.approx(0.03)
    assert prof.relative == (1.0, 1.6, 1.5, 3.7)  # raw medians kept as measured
    for outside in (0, 9):
        with pytest.raises(ValueError, match="measured"):
            prof.relative_at(outside)


def test_from_absolute_normalizes_to_one_row():
    prof = VerifyCostProfile.from_absolute([4, 1, 2], [0.046, 0.02, 0.032], model="m", backend="b",
                                           threads=2, machine="x")
    assert prof.rows == (1, 2, 4)
    assert prof.relative == pytest.approx((1.0, 1.6, 2.3))
    with pytest.raises(ValueError, match="n = 1"):
        VerifyCostProfile.from_absolute([2, 4], [0.1, 0.2], model="m", backend="b", threads=1, machine="x")


@pytest.mark.parametrize(
    "rows, rel",
    [((), ()), ((1, 1), (1.0, 1.0)), ((2, 1), (1.0, 1.0)), ((0, 1), (1.0, 1.0)), ((1, 2), (1.0, -1.0)), ((1,), (1.0, 2.0))],
)
def test_profile_refuses_malformed(rows, rel):
    with pytest.raises(ValueError):
        VerifyCostProfile(rows=rows, relative=rel, absolute_s=None, model="m", backend="b", threads=1, machine="x")


def test_profile_artifact_round_trip_and_tamper(tmp_path):
    prof = VerifyCostProfile.from_absolute([1, 2, 4], [0.02, 0.032, 0.046], model="qwen", backend="llamacpp",
                                           threads=2, machine="x86_64", provenance={"runs": 20})
    manifest = prof.save(tmp_path / "hw")
    assert manifest.kind == "verify_profile" and manifest.provenance["backend"] == "llamacpp"
    assert VerifyCostProfile.load(tmp_path / "hw") == prof
    data = tmp_path / "hw" / "verify_profile.json"
    data.write_text(data.read_text().replace("0.046", "0.036"))
    with pytest.raises(ArtifactError):
        VerifyCostProfile.load(tmp_path / "hw")


# ----------------------------------------------------------------------------- tree artifact


def _inputs(tmp_path):
    acc = AcceptanceProfile.from_counts([820, 86, 22], 1000).save(tmp_path / "acc")
    hw = toy_profile().save(tmp_path / "hw")
    return acc.hash, hw.hash


def test_tree_artifact_round_trip(tmp_path):
    acc_hash, hw_hash = _inputs(tmp_path)
    choice = toy_choice()
    manifest = save_tree_artifact(tmp_path / "tree", choice, acc_hash, hw_hash, {"verifier": "sequoia"})
    loaded = load_tree_artifact(tmp_path / "tree", acceptance_manifest_hash=acc_hash, hardware_manifest_hash=hw_hash)
    assert loaded.choice == choice
    assert loaded.policy == {"verifier": "sequoia"}
    assert loaded.manifest_hash == manifest.hash == read_manifest(tmp_path / "tree").hash


def test_tree_artifact_refuses_other_inputs(tmp_path):
    acc_hash, hw_hash = _inputs(tmp_path)
    save_tree_artifact(tmp_path / "tree", toy_choice(), acc_hash, hw_hash, {})
    with pytest.raises(ArtifactError, match="acceptance"):
        load_tree_artifact(tmp_path / "tree", acceptance_manifest_hash="0" * 64)
    with pytest.raises(ArtifactError, match="hardware"):
        load_tree_artifact(tmp_path / "tree", hardware_manifest_hash="0" * 64)
    with pytest.raises(ArtifactError, match="draft hardware"):  # priced flat: no draft profile to match
        load_tree_artifact(tmp_path / "tree", draft_hardware_manifest_hash="d" * 64)
    save_tree_artifact(tmp_path / "priced", toy_choice(), acc_hash, hw_hash, {}, draft_hardware_manifest_hash="d" * 64)
    assert load_tree_artifact(tmp_path / "priced", draft_hardware_manifest_hash="d" * 64).draft_hardware_manifest_hash
    with pytest.raises(ArtifactError, match="draft hardware"):
        load_tree_artifact(tmp_path / "priced", draft_hardware_manifest_hash="e" * 64)


def test_tree_hash_changes_with_every_input(tmp_path):
    acc_hash, hw_hash = _inputs(tmp_path)
    base = dict(choice=toy_choice(), acc=acc_hash, hw=hw_hash, policy={"verifier": "sequoia", "temperature": 0.0})
    variants = {
        "base": base,
        "topology": {**base, "choice": toy_choice(1.0)},
        "acceptance": {**base, "acc": "a" * 64},
        "hardware": {**base, "hw": "b" * 64},
        "policy": {**base, "policy": {"verifier": "sequoia", "temperature": 0.7}},
        "draft hardware": {**base, "draft": "c" * 64},
    }
    hashes = {}
    for name, v in variants.items():
        hashes[name] = save_tree_artifact(tmp_path / name, v["choice"], v["acc"], v["hw"], v["policy"],
                                          v.get("draft")).hash
    assert len(set(hashes.values())) == len(hashes)
    # Deterministic: the same inputs give the same hash (no timestamp in the hash).
    again = save_tree_artifact(tmp_path / "again", base["choice"], acc_hash, hw_hash, base["policy"])
    assert again.hash == hashes["base"]


def test_tampered_tree_refused(tmp_path):
    acc_hash, hw_hash = _inputs(tmp_path)
    directory = tmp_path / "tree"
    save_tree_artifact(directory, toy_choice(), acc_hash, hw_hash, {})
    data = directory / "tree.json"
    body = json.loads(data.read_text())
    body["paths"] = [[0], [1], [0, 0], [0, 1]]
    data.write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match="tampered"):
        load_tree_artifact(directory)
    # Re-sealing the manifest does not help: the recorded topology hash no longer matches.
    old = read_manifest(directory, verify=False)
    write_manifest(directory, "tree", old.provenance)
    with pytest.raises(ArtifactError, match="topology"):
        load_tree_artifact(directory)


def test_registered_optimizer_oracles_pass():
    from draftwise.oracles import ORACLES
    from draftwise.oracles.hardware_tree import hardware_tree_toy, sequoia_dp_brute_force

    assert hardware_tree_toy in ORACLES and sequoia_dp_brute_force in ORACLES
    for oracle in (hardware_tree_toy, sequoia_dp_brute_force):
        result = oracle()
        assert result.passed, result
    assert hardware_tree_toy().computed == pytest.approx(3.49588976, abs=1e-12)
