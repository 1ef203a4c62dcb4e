"""Calibration counting (slot paths from the round ledger), `draftwise tree optimize` on
artifacts (the design's toy oracle through the CLI, stale inputs refused) and tree artifacts
as `--tree` (refused under another sampling policy)."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from draftwise.artifacts import read_manifest
from draftwise.preflight import planned_contracts, preflight
from draftwise.plan import read_tree_artifact
from tests.helpers import make_spec
from draftwise.cli import app
from draftwise.runtime.contracts import TopologyKind
from draftwise.runtime.round import GenerationConfig, slot_path
from draftwise.optimize.acceptance import AcceptanceProfile
from draftwise.optimize.select import draft_round_steps
from draftwise.optimize.calibrate import calibrate, calibration_spec, count_slots
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.select import load_tree_artifact
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.stats import RoundRecord
from draftwise.topology.compile import TreeLimits, compile_round
from tests.helpers import result_from_paths

TOY_H = [0.82, 0.48, 0.24]
TOY_T = [1.00, 1.00, 1.03, 1.08, 1.16, 1.28, 1.43, 1.62]  # n = 1..8 (t(1) = t(2) = 1)
GREEDY = SamplingPolicy().as_dict()


def compiled(paths):
    return compile_round(10, [result_from_paths(paths)], TreeLimits(max_nodes=64, max_depth=8))


def record(accepted: int, path) -> RoundRecord:
    return RoundRecord(nodes=4, proposal_depth=2, accepted=accepted, emitted=accepted + 1, fallback=False,
                       kv_bytes=0, slot_path=tuple(path))


# ------------------------------------------------------------------ slot paths and counting


def test_slot_path_reports_offered_and_selected_slot_per_reached_node():
    round_ = compiled([[5, 7], [6], [8, 9], [8, 3]])  # frontier children 5, 6, 8 in proposal order
    rows = {tuple(round_.path_tokens(r)): r for r in range(round_.n)}
    assert slot_path(round_, []) == ((3, -1),)
    assert slot_path(round_, [rows[(6,)]]) == ((3, 1),)  # 6 has no children: the path stops
    assert slot_path(round_, [rows[(8,)]]) == ((3, 2), (2, -1))
    assert slot_path(round_, [rows[(8,)], rows[(8, 3)]]) == ((3, 2), (2, 1))
    assert slot_path(compiled([]), []) == ()


def test_count_slots_by_depth():
    records = [
        record(0, [(3, -1)]),  # nothing selected at depth 1
        record(1, [(3, 0), (2, -1)]),  # slot 0, then nothing at depth 2
        record(2, [(3, 2), (2, 1)]),
        record(0, []),  # a fallback round: the frontier was reached, nothing offered
        dataclasses.replace(record(0, []), nodes=0, asked=False),  # room for one token: nothing could be offered
    ]
    selected, reached = count_slots(records, width=3, depth=2)
    assert reached == [4, 2]
    assert selected == [[1, 0, 1], [0, 1, 0]]
    profile = AcceptanceProfile.from_counts(selected, reached)
    assert profile.p[0] == pytest.approx((0.25, 0.0, 0.25))
    assert sum(profile.p[0]) < 1  # "none selected" stays in the remainder


def test_calibration_costs_are_medians_of_the_rounds_after_the_prompt_read():
    class Replayed:  # a decoder whose generations are these records
        def __init__(self, records):
            self.records = records

        def generate(self, prompt):
            return dataclasses.make_dataclass("Result", ["records", "tokens"])(self.records, [1, 2, 3])

    first = dataclasses.replace(record(1, [(3, 0), (2, -1)]), reads_prompt=True,
                                seconds={"prefill": 9.0, "propose": 5.0})
    later = [dataclasses.replace(record(0, [(3, -1)]), seconds={"verify": v, "propose": p})
             for v, p in [(1.0, 0.1), (2.0, 0.3), (3.0, 0.2)]]
    counts = calibrate(Replayed([first, *later]), [[1], [2]], width=3, depth=2)
    assert (counts.verify_seconds_median, counts.propose_seconds_median) == (2.0, 0.2)
    assert counts.rounds == 8 and counts.new_tokens == 6
    # per drafted level: every round drafted depth 2, so c is half a round's proposal time
    assert counts.draft_step_seconds == pytest.approx(0.1)
    # a depth-1 without-replacement calibration drafts a [W, 1] tree: two draft passes a round,
    # though one depth is measured (dividing by the measured depth gave 0.2, twice the cost)
    assert calibrate(Replayed([first, *later]), [[1], [2]], width=3, depth=1).draft_step_seconds == pytest.approx(0.1)


def test_rounds_that_could_not_offer_the_whole_depth_or_were_gated_are_not_counted():
    cut = dataclasses.replace(record(0, [(3, -1)]), depth_limit=1)  # the generation's last rounds: depth 1 only
    gated = dataclasses.replace(record(0, [(3, -1)]), gated=True)
    whole = dataclasses.replace(record(1, [(3, 0), (2, 1)]), depth_limit=2)
    selected, reached = count_slots([cut, gated, whole], width=3, depth=2)
    assert reached == [1, 1] and selected == [[1, 0, 0], [0, 1, 0]]


def test_an_eos_among_the_accepted_rows_ends_the_count_there():
    # the verifier accepted three rows, the first of them EOS: one accepted row was published,
    # so depth 3 was never reached, and its selection must not be counted either
    eos_first = dataclasses.replace(record(1, [(3, 0), (2, 1), (2, 0)]), proposal_depth=3)
    selected, reached = count_slots([eos_first], width=3, depth=3)
    assert reached == [1, 1, 0]
    assert selected == [[1, 0, 0], [0, 1, 0], [0, 0, 0]]


def test_count_slots_refuses_a_round_wider_than_the_width():
    with pytest.raises(ValueError, match="more than the width"):
        count_slots([record(1, [(4, 3)])], width=3, depth=1)


# ------------------------------------------------------------------ tree optimize (CLI)


def write_inputs(tmp_path, backend="llamacpp", threads=2):
    acceptance = tmp_path / "acceptance"
    AcceptanceProfile.from_conditional(TOY_H, provenance={
        "target": "toy-model", "backend": "llamacpp", "threads": 2, "policy": GREEDY, "draft_step_seconds": 0.009,
    }).save(acceptance)
    profile = tmp_path / "profile"
    VerifyCostProfile.from_absolute(list(range(1, 9)), [0.1 * t for t in TOY_T], model="toy-model", backend=backend,
                                    threads=threads, machine="test").save(profile)
    return acceptance, profile


def optimize_toy(tmp_path):
    """`draftwise tree optimize` over the toy inputs, n <= 8 and depth <= 4 as in the design."""
    acceptance, profile = write_inputs(tmp_path)
    out = tmp_path / "tree"
    result = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(acceptance), "--profile", str(profile),
                                      "--max-nodes", "8", "--max-depth", "4", "--out", str(out)])
    return acceptance, profile, out, result


def test_tree_optimize_cli_reproduces_the_toy_oracle(tmp_path):
    # measured c: 0.009 s per depth over t(1) = 0.1 s -> 0.09 plain steps, the toy's c
    acceptance, profile, out, result = optimize_toy(tmp_path)
    assert result.exit_code == 0, result.output
    artifact = load_tree_artifact(out, acceptance_manifest_hash=read_manifest(acceptance).hash,
                                  hardware_manifest_hash=read_manifest(profile).hash)
    choice = artifact.choice
    assert (choice.n, choice.d) == (5, 4)
    assert choice.paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    assert choice.expected_tokens == pytest.approx(3.49588976, abs=1e-12)
    assert choice.draft_cost == pytest.approx(0.09)
    assert dict(artifact.policy) == GREEDY
    assert "n=5 d=4" in result.output


@pytest.mark.parametrize("backend, threads, message", [("transformers", 2, "backend"), ("llamacpp", 8, "threads")])
def test_tree_optimize_refuses_artifacts_of_another_configuration(tmp_path, backend, threads, message):
    acceptance, profile = write_inputs(tmp_path, backend=backend, threads=threads)
    result = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(acceptance), "--profile", str(profile),
                                      "--out", str(tmp_path / "tree")])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "tree").exists()


# ------------------------------------------------------------------ tree artifacts as --tree


@pytest.mark.parametrize("relation, verifier", [("iid", "specinfer"), ("without_replacement", "sequoia"),
                                                ("beam", "greedy")])
def test_calibration_is_verified_by_the_verifier_of_the_trees_it_feeds(relation, verifier):
    """A sampled width-4 depth-1 calibration must not become a set verified by SpecTr: the DP's
    trees are verified per node by SpecInfer / Sequoia, whose slot acceptances differ."""
    policy = SamplingPolicy() if relation == "beam" else SamplingPolicy(temperature=1.0)
    spec = calibration_spec("qwen2.5-coder-1.5b", "llamacpp", 2, "draft-model", "qwen2.5-coder-0.5b",
                            4, 1, relation, policy, 48, 0)
    assert preflight(spec) == verifier
    assert sorted(path for path in spec.family_config.template if len(path) == 1) == [(0,), (1,), (2,), (3,)]


def test_tree_artifact_is_a_draft_template_under_its_own_policy_only(tmp_path):
    _, _, out, result = optimize_toy(tmp_path)
    assert result.exit_code == 0, result.output
    spec = make_spec(proposer="draft-model", tree=str(out), relation="beam")
    assert read_tree_artifact(spec.family_config.tree, spec).paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    assert planned_contracts(spec)[0].topology is TopologyKind.TREE
    sampled = make_spec(proposer="draft-model", tree=str(out), relation="without_replacement",
                        generation=GenerationConfig(policy=SamplingPolicy(temperature=1.0)))
    with pytest.raises(ValueError, match="optimized under sampling policy"):
        read_tree_artifact(sampled.family_config.tree, sampled)


def test_tampered_tree_artifact_is_refused(tmp_path):
    _, _, out, _ = optimize_toy(tmp_path)
    data = out / "tree.json"
    data.write_text(data.read_text().replace('"n": 5', '"n": 6'))
    with pytest.raises(Exception, match="checksum|sha256|tamper|changed"):
        spec = make_spec(proposer="draft-model", tree=str(out), relation="beam")
        read_tree_artifact(spec.family_config.tree, spec)


# ------------------------------------------------------------------ limits fitted to the proposer


def test_limits_grow_to_the_configured_draft_so_no_drafted_token_goes_unverified():
    from draftwise.spec import fitted_generation

    default = GenerationConfig()
    chain = make_spec(proposer="draft-model", k=20)
    assert fitted_generation(chain).limits.max_depth == 20 > default.limits.max_depth
    lookup = make_spec(proposer="prompt-lookup", lookup=24, candidates=4)
    assert (fitted_generation(lookup).limits.max_nodes, fitted_generation(lookup).limits.max_depth) == (96, 24)
    small = make_spec(proposer="draft-model", tree="cartesian:2,2")
    assert fitted_generation(small) == small.generation  # within the defaults: unchanged
    assert fitted_generation(make_spec(proposer="none")) == default


def write_draft_inputs(tmp_path, draft_model="toy-draft"):
    acceptance = tmp_path / "acceptance"
    AcceptanceProfile.from_conditional(TOY_H, provenance={
        "target": "toy-model", "backend": "llamacpp", "threads": 2, "policy": GREEDY, "draft_step_seconds": 0.009,
        "proposers": [{"name": "draft-model", "checkpoint": "toy-draft"}],
    }).save(acceptance)
    profile, draft = tmp_path / "profile", tmp_path / "draft-profile"
    VerifyCostProfile.from_absolute(list(range(1, 9)), [0.1 * t for t in TOY_T], model="toy-model", backend="llamacpp",
                                    threads=2, machine="test").save(profile)
    # a compute-bound draft: r rows cost r times 0.02 s, a fifth of a target step each
    VerifyCostProfile.from_absolute(list(range(1, 9)), [0.02 * r for r in range(1, 9)], model=draft_model,
                                    backend="llamacpp", threads=2, machine="test").save(draft)
    return acceptance, profile, draft


def test_tree_optimize_prices_drafting_by_the_draft_profile(tmp_path):
    acceptance, profile, draft = write_draft_inputs(tmp_path)
    out = tmp_path / "tree"
    result = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(acceptance), "--profile", str(profile),
                                      "--draft-profile", str(draft), "--max-nodes", "8", "--max-depth", "4",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    artifact = load_tree_artifact(out, draft_hardware_manifest_hash=read_manifest(draft).hash)
    choice = artifact.choice
    assert choice.draft_model == "draft verify profile" and "priced by its profile" in result.output
    # the chosen point's time is t(n) plus the forwards of its tree at 0.2 target steps a row
    drafting = draft_round_steps(choice.paths, choice.expected_tokens, lambda r: 0.02 * r / 0.1)  # t(1) = 0.1 s
    assert choice.time_per_token == pytest.approx((TOY_T[choice.n - 1] + drafting) / choice.expected_tokens)


@pytest.mark.parametrize("extra, draft_model, message", [
    (["--draft-cost", "0.1"], "toy-draft", "not both"),
    ([], "another-draft", "the draft profile times another-draft"),
])
def test_tree_optimize_refuses_a_draft_profile_that_does_not_fit(tmp_path, extra, draft_model, message):
    acceptance, profile, draft = write_draft_inputs(tmp_path, draft_model=draft_model)
    result = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(acceptance), "--profile", str(profile),
                                      "--draft-profile", str(draft), "--out", str(tmp_path / "tree"), *extra])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "tree").exists()


def test_tree_optimize_prices_the_catch_up_by_the_extend_profile(tmp_path):
    acceptance, profile, draft = write_draft_inputs(tmp_path)
    catch_up = tmp_path / "catch-up"
    VerifyCostProfile.from_absolute(list(range(1, 9)), [0.01 * r for r in range(1, 9)], model="toy-draft",
                                    backend="llamacpp", threads=2, machine="test").save(catch_up)
    out = tmp_path / "tree"
    result = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(acceptance), "--profile", str(profile),
                                      "--draft-profile", str(draft), "--draft-catch-up", str(catch_up),
                                      "--max-nodes", "8", "--max-depth", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    choice = load_tree_artifact(out, draft_catch_up_manifest_hash=read_manifest(catch_up).hash).choice
    drafting = draft_round_steps(choice.paths, choice.expected_tokens, lambda r: 0.2 * r, lambda r: 0.1 * r)
    assert choice.time_per_token == pytest.approx((TOY_T[choice.n - 1] + drafting) / choice.expected_tokens)
    alone = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(acceptance), "--profile", str(profile),
                                     "--draft-catch-up", str(catch_up), "--out", str(tmp_path / "alone")])
    assert alone.exit_code == 2 and "profile too" in alone.output
