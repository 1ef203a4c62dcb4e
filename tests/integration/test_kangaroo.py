"""Kangaroo (`--proposer kangaroo`): the target's first l layers, a trained adapter and the
target's LM head, on the layer-skipping backend.

- an untrained adapter (zero output projection, the target's final norm) is the plain early
  exit at layer l, and a random adapter drafting incrementally (extend, chain, tree verify,
  its own cache) equals the same adapter run over each whole sequence from scratch;
- the artifact round-trips, is refused when tampered with or bound to another target;
- sampled drafts follow the target's law at temperature 1 (rejection chains, SpecInfer trees);
- greedy output is plain decoding's (tiny model, and SmolLM2 with the shipped adapter on 10
  Spec-Bench prompts).
"""

from pathlib import Path

import pytest
import torch

from draftwise.backends.layer_skip import LayerSkipBackend
from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.errors import ArtifactError
from draftwise.proposers.family import DrafterResources
from draftwise.proposers.kangaroo import KangarooConfig, open_kangaroo
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.selfdraft.adapter import AdapterMismatch, AdapterTarget, KangarooAdapter, load_adapter, save_adapter
from draftwise.selfdraft.skipset import SkipSet
from draftwise.topology.compile import compile_round
from draftwise.topology.templates import cartesian
from draftwise.topology.tree_spec import TreeTemplate
from draftwise.training.adapter import shallow_states
from draftwise.verify.rejection import RejectionVerifier
from draftwise.verify.registry import make_verifier
from draftwise.verify.specinfer import SpecInferVerifier
from tests.helpers import assert_rows_close, make_spec, result_from_paths
from tests.integration.test_layer_skip_backend import PREFIX, TREE, deep_tiny, rows_of
from tests.integration.test_layer_skip_exact import counts_of
from tests.integration.tiny_heads import exact_law, law_p_value
from tests.integration.conftest import GREEDY_NEW, REAL_PROMPTS

EXIT = 2


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def random_adapter(target, exit_layer: int = EXIT, seed: int = 0) -> KangarooAdapter:
    adapter = KangarooAdapter(target.model, exit_layer)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in adapter.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            value.copy_(base + 0.5 * torch.randn(value.shape, generator=generator))
    return adapter.eval().requires_grad_(False)


def saved(tmp_path, target, adapter, name="adapter"):
    save_adapter(tmp_path / name, adapter, AdapterTarget(target.info.checkpoint, target.info.tokenizer_hash),
                 {"recipe": {"test": True}}, dtype=torch.float32)
    return tmp_path / name


def test_an_untrained_adapter_is_the_plain_early_exit():
    target = deep_tiny()
    shallow = SkipSet.shallow(4, EXIT)
    kangaroo = LayerSkipBackend(target, shallow, exit=KangarooAdapter(target.model, EXIT).eval(), label="kangaroo")
    early = LayerSkipBackend(target, shallow)
    for paths in (None, [[1, 2, 3]], TREE):
        assert_rows_close(rows_of(kangaroo, PREFIX, paths), rows_of(early, PREFIX, paths))


def reference_row(target, adapter, tokens) -> torch.Tensor:
    """The adapter over the whole sequence, from scratch (no cache): logits [V] of its last position."""
    x, rope, mask = shallow_states(target.model, torch.tensor(tokens), EXIT)
    with torch.no_grad():
        return target.model.lm_head(adapter(x, rope, mask, None))[0, -1]


def test_incremental_drafting_equals_the_adapter_over_each_whole_sequence():
    # cached vs whole-sequence attention sums in another order: fp32 rounding apart; a wrong row is O(1) off
    target = deep_tiny()
    adapter = random_adapter(target)
    draft = LayerSkipBackend(target, SkipSet.shallow(4, EXIT), exit=adapter, label="kangaroo")
    draft.reset()
    assert_rows_close(draft.extend(PREFIX[:-2]).logits[0], reference_row(target, adapter, PREFIX[:-2]))
    draft.extend(PREFIX[-2:-1])  # one more committed row, one token at a time
    round_ = compile_round(len(PREFIX), [result_from_paths(TREE)])
    rows = draft.verify(PREFIX[-1], round_).logits
    assert_rows_close(rows[0], reference_row(target, adapter, PREFIX))
    for r in range(round_.n):
        want = reference_row(target, adapter, PREFIX + list(round_.path_tokens(r)))
        assert_rows_close(rows[r + 1], want)
    # the adapter's cache slot comes after the target's layers, and only the shallow layers hold rows
    held = draft.batch._held  # the cache layers its tensors stand for (a row written elsewhere is refused)
    assert held == [0, 1, 4] and all(k.shape[2] == draft.cached_len + 1 + round_.n for k in draft.batch._keys)


def test_the_artifact_round_trips_and_refuses_tampering_and_other_targets(tmp_path):
    target = deep_tiny()
    adapter = random_adapter(target, seed=3)
    directory = saved(tmp_path, target, adapter)
    loaded = load_adapter(directory)
    assert loaded.arch.exit_layer == EXIT and loaded.provenance["family"] == "kangaroo"
    rebuilt = loaded.build(target.model)
    for name, value in adapter.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], value)
    with pytest.raises(AdapterMismatch, match="train one for this target"):
        loaded.check_target("another-model", target.info.tokenizer_hash, target.model)
    with pytest.raises(AdapterMismatch, match="architecture"):
        loaded.check_target(target.info.checkpoint, target.info.tokenizer_hash, deep_tiny(layers=3).model)
    with pytest.raises(AdapterMismatch):
        open_kangaroo(KangarooConfig(adapter=str(directory)), DrafterResources(deep_tiny(seed=9)))
    weights = directory / "adapter.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ArtifactError, match="corrupt or was tampered"):
        load_adapter(directory)


POLICY = SamplingPolicy(temperature=1.0)


@pytest.mark.parametrize("settings, verifier", [
    ({"eta": 0.0}, RejectionVerifier()),
    ({"eta": 0.5}, RejectionVerifier()),
    ({"tree": TreeTemplate(cartesian([2, 2]))}, SpecInferVerifier()),
], ids=["chain", "chain-early-exit", "tree-iid"])
def test_sampled_kangaroo_drafts_emit_the_target_law(tmp_path, settings, verifier):
    target = deep_tiny(seed=2)
    law = exact_law(target, POLICY, [1, 2, 3], 3)
    directory = saved(tmp_path, target, random_adapter(target, seed=1))
    proposer = open_kangaroo(KangarooConfig(adapter=str(directory), **settings), DrafterResources(target))
    counts, seen = counts_of(target, proposer, verifier, POLICY, 1500)
    assert seen["accepted"] > 100 and seen["rejected"] > 100
    assert law_p_value(counts, law) > 1e-3


@pytest.mark.parametrize("tree", [None, "cartesian:2,2"], ids=["chain", "tree"])
def test_greedy_kangaroo_emits_what_plain_decoding_emits_tiny(tmp_path, tree):
    target = deep_tiny(seed=2)
    directory = saved(tmp_path, target, random_adapter(target, seed=1))
    config = GenerationConfig(max_new_tokens=16)
    plain = SpeculativeDecoder(target, [], make_verifier("greedy", [], config.policy), config)
    options = {"proposer": "kangaroo", "adapter": str(directory), "verifier": "greedy", "eta": "0.3",
               **({"tree": tree, "relation": "beam"} if tree else {})}
    assert drafts_accepted_as_plain(build_decoder(make_spec(config, **options), target), plain) > 0


def drafts_accepted_as_plain(decoder, plain, prompts=([1, 2, 3], [5, 0, 7, 7], [4], [2, 6, 1, 3, 0])) -> int:
    """Drafted tokens committed by `decoder` over `prompts`, each output asserted equal to `plain`'s."""
    accepted = 0
    for prompt in prompts:
        result = decoder.generate(prompt)
        assert result.tokens == plain.generate(prompt).tokens
        accepted += sum(result.from_draft)
    return accepted


@pytest.mark.model
def test_greedy_kangaroo_with_the_shipped_adapter_is_plain_decoding_on_smollm2(smol_target, smol_chat_and_plain):
    config = GenerationConfig(max_new_tokens=GREEDY_NEW)
    decoder = build_decoder(make_spec(config, proposer="kangaroo", verifier="greedy"), smol_target)
    accepted = rejected = 0
    for prompt, plain in smol_chat_and_plain:
        result = decoder.generate(prompt)
        assert result.tokens == plain
        accepted += sum(r.accepted for r in result.records)
        rejected += sum(r.nodes > r.accepted for r in result.records)
    assert len(smol_chat_and_plain) == REAL_PROMPTS and accepted > 0 and rejected > 0


def test_a_qwen2_adapter_drafts_incrementally_as_over_whole_sequences():
    from tests.integration.test_layer_skip_backend import tiny_qwen2

    target = tiny_qwen2()
    adapter = random_adapter(target)
    assert adapter.self_attn.q_proj.bias is not None  # the target's own attention class (Qwen2: q/k/v biases)
    draft = LayerSkipBackend(target, SkipSet.shallow(4, EXIT), exit=adapter, label="kangaroo")
    draft.reset()
    draft.extend(PREFIX[:-1])
    round_ = compile_round(len(PREFIX), [result_from_paths(TREE)])
    rows = draft.verify(PREFIX[-1], round_).logits
    assert_rows_close(rows[0], reference_row(target, adapter, PREFIX))
    for r in range(round_.n):
        assert_rows_close(rows[r + 1], reference_row(target, adapter, PREFIX + list(round_.path_tokens(r))))


def test_tuning_measures_every_adapter_and_eta_and_picks_the_fastest(tmp_path):
    from draftwise.optimize.kangaroo_tune import tune_kangaroo

    target = deep_tiny(seed=2)
    shallow = saved(tmp_path, target, random_adapter(target, exit_layer=1, seed=1), "l1")
    deeper = saved(tmp_path, target, random_adapter(target, exit_layer=2, seed=1), "l2")
    choice = tune_kangaroo(target, [shallow, deeper], [0.0, 0.5], [[1, 2, 3], [5, 0, 7]], 8)
    assert [(row["exit_layer"], row["eta"]) for row in choice.table] == [(1, 0.0), (1, 0.5), (2, 0.0), (2, 0.5)]
    assert choice.f == min(row["f"] for row in choice.table) and choice.plain > 0
    assert (choice.adapter, choice.eta) in {(Path(row["adapter"]), row["eta"]) for row in choice.table}
