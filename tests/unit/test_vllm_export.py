"""`draftwise export vllm`'s arithmetic on hand-made profiles and outputs (no vLLM, no model)."""

from __future__ import annotations

import json

import pytest

from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.vllm.exported import load_exported_method
from draftwise.vllm.export import (ExportConfig, Workload, plan_export, speculative_config,
                                   verify_rows, write_export)
from draftwise.vllm.predict import BatchChoice, Round, choose, predicted_speedup, replay, schedule
from draftwise.vllm.protocol import BatchResult

ROWS = tuple(range(1, 10))


def profile(cost) -> VerifyCostProfile:
    return VerifyCostProfile(rows=ROWS, relative=tuple(float(cost(n)) for n in ROWS), absolute_s=None,
                             model="m", backend="b", threads=1, machine="x")


# rows nearly free at B = 1 (a memory-bound step), as costly as separate steps at B = 8 (compute-bound)
PROFILES = BatchCostProfile({1: profile(lambda n: 1 + 0.05 * (n - 1)), 8: profile(lambda n: n)})
PROMPT = (1, 2, 3, 4, 5, 6, 7, 8)
OUTPUT = (1, 2, 3, 4, 5, 6, 7, 8, 9)  # the output repeats the prompt: lookup drafts it exactly


def test_replay_follows_the_greedy_output():
    rounds = replay(PROMPT, OUTPUT, k=4, max_ngram=2)
    # round 1: the suffix "7 8" has no earlier occurrence, "8" neither: a plain step emits 1;
    # then the context ends "8 1": "1" occurs at 0 -> draft 2 3 4 5, all accepted, + 1 = 5 tokens; ...
    assert sum(r.emitted for r in rounds) == len(OUTPUT)
    assert rounds[0] == Round(0, 1) and rounds[1] == Round(4, 5)
    assert all(r.emitted <= r.drafted + 1 for r in rounds)


def test_a_wrong_draft_costs_rows_and_emits_one():
    rounds = replay((5, 6, 5), (7,), k=3, max_ngram=1)  # "5" was followed by 6 5: drafts 6 5, target says 7
    assert rounds == (Round(2, 1),)


def test_speedup_prices_rounds_by_the_profile():
    rounds = [Round(4, 5), Round(0, 1)]
    assert predicted_speedup(rounds, profile(lambda n: 1)) == pytest.approx(6 / 2)
    assert predicted_speedup(rounds, profile(lambda n: n)) == pytest.approx(6 / 6)


def test_choice_speculates_where_rows_are_cheap_and_not_where_they_cost_full_steps():
    rounds_by_k = {k: [Round(k, 1)] * 3 + [Round(k, k + 1)] for k in range(1, 6)}  # one round in four accepts all
    small, large = choose(rounds_by_k, PROFILES, [1, 8])
    assert small.k > 0 and small.predicted > 1.0
    assert large.k == 0 and large.predicted == 1.0 and large.by_k[1] < 1.0


def test_schedule_ranges_hold_each_measured_k_until_the_next_size():
    choices = [BatchChoice(1, 4, 1.3, {}), BatchChoice(2, 2, 1.1, {}), BatchChoice(8, 0, 1.0, {})]
    assert schedule(choices) == [[1, 1, 4], [2, 7, 2], [8, 8, 0]]


def test_speculative_config_shapes():
    mixed = [BatchChoice(1, 4, 1.3, {}), BatchChoice(8, 0, 1.0, {})]
    body = speculative_config(3, mixed, per_batch_schedule=True)
    assert body == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
                    "num_speculative_tokens_per_batch_size": [[1, 7, 4], [8, 8, 0]]}
    assert speculative_config(3, mixed, per_batch_schedule=False)["num_speculative_tokens"] == 4
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(3, mixed, per_batch_schedule=False)
    assert speculative_config(3, [BatchChoice(1, 0, 1.0, {})], per_batch_schedule=True) is None


def test_plan_picks_k_and_ngram_from_the_workload():
    workload = Workload(prompts=(PROMPT,), outputs=(OUTPUT,))
    ngram, choices = plan_export(workload, PROFILES, ExportConfig(batches=(1, 8), max_k=6, ngram_sizes=(1, 2)))
    assert ngram in (1, 2)
    assert [c.batch for c in choices] == [1, 8] and choices[0].k > 0


def test_export_artifact_round_trips_and_verification_reports_the_error(tmp_path):
    choices = [BatchChoice(1, 4, 1.25, {0: 1.0, 4: 1.25}), BatchChoice(8, 0, 1.0, {0: 1.0})]
    spec = speculative_config(2, choices, per_batch_schedule=True)
    out = write_export(tmp_path / "export", ExportConfig(batches=(1, 8)), 2, choices, spec, {"target": "t"})
    method = load_exported_method(out)
    assert method.speculative_config == spec
    results = [BatchResult("vllm-plain", 1, ((1, 2),), 1.0, 20), BatchResult("vllm-exported", 1, ((1, 2),), 1.0, 30),
               BatchResult("vllm-ngram", 1, ((1, 2),), 1.0, 22), BatchResult("vllm-exported-custom", 1, ((1, 2),), 1.0, 25)]
    (row,) = verify_rows(choices, results, "vllm-exported", "vllm-ngram")
    assert row["measured"] == pytest.approx(1.5) and row["error"] == pytest.approx(1.5 / 1.25 - 1)
    assert row["default_vs_plain"] == pytest.approx(1.1) and row["identical_to_plain"] == 1
    assert row["custom_vs_plain"] == pytest.approx(1.25)
    assert json.loads((out / "manifest.json").read_text())["kind"] == "vllm_export"


def test_custom_form_carries_the_same_choice(tmp_path):
    from draftwise.vllm.methods import PROPOSER_ENV, CustomDrafterConfig, parse_method

    choices = [BatchChoice(1, 6, 2.0, {}), BatchChoice(4, 2, 1.4, {}), BatchChoice(8, 0, 1.0, {})]
    out = write_export(tmp_path / "export", ExportConfig(batches=(1, 4, 8)), 3, choices,
                       speculative_config(3, choices, per_batch_schedule=True), {"target": "t"})
    method = parse_method(f"vllm-export-custom={out}")
    config = CustomDrafterConfig.from_json(method.env[PROPOSER_ENV])
    assert method.speculative_config["num_speculative_tokens"] == 6 and config.max_ngram == 3
    assert [config.k_for(b) for b in (1, 2, 3, 4, 7, 8, 16)] == [6, 6, 6, 2, 2, 0, 0]  # past the last range: its K, as vLLM reads it


def test_medusa_full_vocabulary_drops_the_token_map_and_shares_the_target_head():
    import torch

    from draftwise.vllm.medusa import full_vocabulary

    config = {"vocab_size": 6, "truncated_vocab_size": 3, "num_heads": 2, "original_lm_head": True}
    tensors = {"blocks.0.layers.0.weight": torch.ones(2, 2), "blocks.1.layers.0.weight": torch.ones(2, 2),
               "lm_heads.0.weight": torch.ones(3, 2), "token_map": torch.tensor([0, 2, 5])}
    target_head = torch.arange(12.0).reshape(6, 2)
    new_config, new_tensors = full_vocabulary(config, tensors, target_head)
    assert new_config["truncated_vocab_size"] == 6 and new_config["original_lm_head"] and config["truncated_vocab_size"] == 3
    assert set(new_tensors) == {"blocks.0.layers.0.weight", "blocks.1.layers.0.weight", "lm_heads.0.weight"}
    assert torch.equal(new_tensors["lm_heads.0.weight"], target_head)
    with pytest.raises(ValueError, match="rows"):
        full_vocabulary(config, tensors, torch.zeros(5, 2))
