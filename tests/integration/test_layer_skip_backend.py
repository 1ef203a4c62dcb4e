"""The layer-skipping draft pass (backends/layer_skip.py) on the target's own modules.

- an empty skip set reproduces the target's logits (extend, chain verify, tree verify);
- a non-empty skip set equals an independent reference: a copy of the model whose skipped
  sublayers are zeroed at their output projection (attention o_proj, MLP down_proj), run by
  the model's own forward, so masks, positions and the draft's own cache are checked too;
- drafting never touches the target's cache; the draft's cache holds rows for the layers whose
  attention it runs only, and follows commit / rollback / truncate;
- after a rejected round, the draft's next proposal equals a fresh run's.
"""

import copy

import numpy as np
import pytest
import torch

from draftwise.backends.base import BackendError
from draftwise.backends.layer_skip import LayerSkipBackend
from draftwise.backends.transformers import TransformersBackend
from draftwise.proposers.base import RoundFeedback
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.selfdraft.skipset import SkipSet
from draftwise.topology.compile import compile_round
from tests.helpers import assert_probs_close, assert_rows_close, result_from_paths
from tests.integration.tiny_models import tiny_backend


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def deep_tiny(seed: int = 0, layers: int = 4) -> TransformersBackend:
    """A 4-layer tiny Llama (the shared tiny models have 2 layers: too few skip patterns)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftwise.backends.base import BackendInfo
    from tests.integration.tiny_models import TinyTokenizer, V

    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.6, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    info = BackendInfo(name="transformers", checkpoint=f"tiny-llama{layers}-seed{seed}", tokenizer_hash="tiny",
                       vocab_size=V, context_length=64, dtype="float32", device="cpu", eos_token_ids=frozenset({V + 1}))
    return TransformersBackend(model, TinyTokenizer(), info)


def zeroed_reference(target: TransformersBackend, skip: SkipSet) -> TransformersBackend:
    """The target with each skipped sublayer's output projection zeroed: its forward is the
    skipped pass (the sublayer adds exactly 0), computed by the model's own code."""
    model = copy.deepcopy(target.model)
    for i, layer in enumerate(model.model.layers):
        if skip.skips_attention(i):
            torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
        if skip.skips_mlp(i):
            torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    return TransformersBackend(model, target.tokenizer, target.info)


def rows_of(backend, prefix, round_paths):
    """Logits [1 + N, V] of a tree round after `prefix` (its last token pending)."""
    backend.reset()
    backend.extend(prefix[:-1])
    round_ = compile_round(len(prefix), [result_from_paths(round_paths)]) if round_paths else None
    logits = backend.verify(prefix[-1], round_).logits.clone()
    backend.rollback()
    return logits


TREE = [[1, 2, 3], [1, 4], [5, 6], [7]]
PREFIX = [3, 1, 4, 1, 5, 2, 6]


def test_an_empty_skip_set_reproduces_the_target_logits():
    target = deep_tiny()
    draft = LayerSkipBackend(target, SkipSet.none(4))
    assert draft.model is target.model  # the same loaded module: no second copy of the weights
    for paths in (None, [[1, 2, 3, 4]], TREE):  # pending only, a chain (causal mask), a tree (4D mask)
        want = rows_of(target, PREFIX, paths)
        got = rows_of(draft, PREFIX, paths)
        assert_rows_close(got, want)
    target.reset(), draft.reset()
    assert_rows_close(draft.extend(PREFIX).logits, target.extend(PREFIX).logits)


@pytest.mark.parametrize("bits", ["01100110", "10101010", "00001111", "11000011"])
def test_a_skip_set_equals_the_model_with_those_sublayers_zeroed(bits):
    target = deep_tiny()
    skip = SkipSet.parse_bits(bits)
    draft, reference = LayerSkipBackend(target, skip), zeroed_reference(target, skip)
    for paths in (None, [[1, 2, 3, 4]], TREE):
        assert_rows_close(rows_of(draft, PREFIX, paths), rows_of(reference, PREFIX, paths))
    # and it really is another model: the skipped pass parts from the target
    assert (rows_of(draft, PREFIX, TREE) - rows_of(target, PREFIX, TREE)).abs().max() > 1e-2


def test_drafting_never_touches_the_target_cache_and_keeps_rows_only_where_attention_runs():
    target = deep_tiny()
    skip = SkipSet.parse_bits("11010011")  # attention runs in layers 1 and 2 only; layer 3 not at all
    draft = LayerSkipBackend(target, skip)
    target.reset()
    target.extend(PREFIX)
    before = [t.clone() for t in target.batch._keys + target.batch._values]
    draft.reset()
    draft.extend(PREFIX)
    round_ = compile_round(len(PREFIX) + 1, [result_from_paths(TREE)])
    draft.verify(2, round_)
    draft.commit([0, 1])
    draft.truncate(len(PREFIX) + 1)
    assert target.cached_len == len(PREFIX) and target.batch is not draft.batch
    assert all(torch.equal(t, old) for t, old in zip(target.batch._keys + target.batch._values, before))
    # its tensors stand for cache layers 1 and 2 (a skipped layer given rows is refused), at the committed length
    assert draft.batch._held == [1, 2] and len(draft.batch._keys) == 2
    assert all(k.shape[2] == len(PREFIX) + 1 for k in draft.batch._keys + draft.batch._values)
    assert draft.info.kv_row_bytes == target.info.kv_row_bytes // 4 * 2


def test_a_tree_commit_gathers_the_accepted_rows_like_a_fresh_prefill():
    """Commit keeps a non-prefix path of a tree (gathered rows) in the layers that run."""
    target = deep_tiny()
    skip = SkipSet.parse_bits("01100110")
    draft = LayerSkipBackend(target, skip)
    draft.reset()
    draft.extend(PREFIX[:-1])
    round_ = compile_round(len(PREFIX), [result_from_paths(TREE)])
    draft.verify(PREFIX[-1], round_)
    path = [round_.path_tokens(i) for i in range(round_.n)].index((5, 6))
    accepted = [int(round_.parent[path]), path]
    draft.commit(accepted)
    got = draft.verify(1, None).logits[0].clone()
    draft.rollback()
    want = rows_of(draft, PREFIX + [5, 6, 1], None)[0]
    assert_rows_close(got, want)


def test_after_a_rejected_round_the_next_proposal_equals_a_fresh_runs():
    target = deep_tiny()
    skip = SkipSet.parse_bits("00110000")

    def proposer():
        p = DraftModelProposer(LayerSkipBackend(target, skip), "tiny", DraftConfig(k=4, confidence_threshold=0.0))
        p.begin(SamplingPolicy(), np.random.default_rng(0))
        return p

    drafting = proposer()
    context = list(PREFIX)
    first = drafting.propose(context, "m")
    bonus = (int(first.nodes[1].token) + 1) % 8  # the target took another token at depth 2
    drafting.observe(RoundFeedback(first, (0,), (int(first.nodes[0].token), bonus)))
    committed = context + [int(first.nodes[0].token), bonus]
    again, fresh = drafting.propose(committed, "m"), proposer().propose(committed, "m")
    assert [n.token for n in again.nodes] == [n.token for n in fresh.nodes]
    for parent in fresh.distributions:
        assert_probs_close(again.distributions[parent], fresh.distributions[parent], f"q after {parent}")


def test_unsupported_models_and_hidden_state_requests_are_refused():
    target = tiny_backend(0)
    draft = LayerSkipBackend(target, SkipSet.none(2))
    with pytest.raises(BackendError, match="hidden states"):
        draft.track_hidden()
    with pytest.raises(ValueError, match="layers"):
        LayerSkipBackend(target, SkipSet.none(3))
    target.model.config.model_type = "gemma"
    try:
        with pytest.raises(BackendError, match="gemma"):
            LayerSkipBackend(target, SkipSet.none(2))
    finally:
        target.model.config.model_type = "llama"


@pytest.mark.model
def test_on_smollm2_an_empty_skip_set_reproduces_the_target(smol_target):
    layers = smol_target.model.config.num_hidden_layers
    draft = LayerSkipBackend(smol_target, SkipSet.none(layers))
    prefix = smol_target.tokenize("The capital of France is Paris, and the capital of Italy is")
    for paths in (None, [[100, 200, 300]], [[100, 200], [300], [400, 500]]):
        want = rows_of(smol_target, prefix, paths)
        got = rows_of(draft, prefix, paths)
        assert_rows_close(got, want)


def tiny_qwen2(seed: int = 0, layers: int = 4) -> TransformersBackend:
    """A tiny random Qwen2 (q/k/v biases, grouped KV heads): the other decoder family shipped."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from draftwise.backends.base import BackendInfo
    from tests.integration.tiny_models import TinyTokenizer, V

    config = Qwen2Config(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.6, tie_word_embeddings=False, use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # Qwen2 initializes its biases at zero: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    info = BackendInfo(name="transformers", checkpoint=f"tiny-qwen2-{layers}-seed{seed}", tokenizer_hash="tiny",
                       vocab_size=V, context_length=64, dtype="float32", device="cpu", eos_token_ids=frozenset({V + 1}))
    return TransformersBackend(model, TinyTokenizer(), info)


@pytest.mark.parametrize("bits", ["00000000", "01100110", "11000011"])
def test_qwen2_skip_sets_equal_the_zeroed_reference(bits):
    target = tiny_qwen2()
    skip = SkipSet.parse_bits(bits)
    draft, reference = LayerSkipBackend(target, skip), zeroed_reference(target, skip)
    for paths in (None, [[1, 2, 3, 4]], TREE):
        assert_rows_close(rows_of(draft, PREFIX, paths), rows_of(reference, PREFIX, paths))
