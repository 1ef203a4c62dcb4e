"""Hydra++ and Clover modules: Clover's recurrence (shapes at every depth, the cosine gate
against a hand computation, the state carried step by step), the prefix-attention layer read
incrementally equal to one causal pass (the property its run-time KV rests on), untrained
context layers and recurrences that start as the identity, and the arch fields an older
artifact lacks."""

import math

import pytest
import torch

from draftwise.errors import InputError
from draftwise.heads.arch import CloverHeads, HeadArch, HydraHeads, make_heads
from draftwise.heads.clover import RegressiveAttention
from draftwise.heads.prefix import PrefixLayer
from tests.helpers import assert_rows_close, rows_close

D, V, K = 16, 40, 3


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return module


@pytest.mark.parametrize("prefix", [False, True])
def test_clover_keeps_a_fixed_width_state_at_every_depth(prefix):
    heads = randomize(CloverHeads(HeadArch("clover", K, D, 2, V, V, prefix=prefix)))
    assert isinstance(make_heads(HeadArch("clover", K, D, 1, V, V)), CloverHeads)
    assert (heads.prefix is not None) == prefix
    h, path = torch.randn(5, D), torch.randn(5, K, D)  # [B, d], [B, K, d]
    state = h
    for i in range(1, K + 1):
        state = heads.step(state, path[:, i - 1])
        assert state.shape == (5, D)  # the state never widens (Hydra's input is (i + 1) d)
        out = heads.path_state(i, h, path[:, :i])
        assert out.shape == (5, D)
        assert_rows_close(out, heads.predict(i, state))  # path_state = i steps, then predictor i
    with pytest.raises(InputError, match="reads 2 path embeddings"):
        heads.path_state(2, h, path[:, :3])
    with pytest.raises(InputError, match="depths 1..3"):
        heads.predict(4, h)


def test_the_regressive_gate_is_the_cosine_of_query_and_key_per_head():
    d = 4  # one attention head (attention_heads(4) == 1)
    block = RegressiveAttention(d)
    with torch.no_grad():
        block.norm.weight.fill_(1.0)
        for lin in (block.q, block.k, block.v):
            lin.weight.copy_(torch.eye(d))
            lin.bias.zero_()
    h = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    e = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    # Q = Norm(h) = h * 2 (rms of h is 1/2), K = e, V = e: gate = cos(h, e) = 1/sqrt(2)
    expected = h + e / math.sqrt(2)
    assert_rows_close(block(h, e), expected)


def test_an_untrained_recurrence_and_context_layer_are_the_identity():
    heads = CloverHeads(HeadArch("clover", K, D, 1, V, V, prefix=True))
    h, e = torch.randn(3, D), torch.randn(3, D)
    assert torch.equal(heads.step(h, e), h)  # W_V starts at zero: the step adds exactly 0
    x = torch.randn(2, 7, D)
    assert heads.prefix is not None and torch.equal(heads.prefix(x), x)  # likewise


def test_the_prefix_layer_read_in_chunks_equals_one_causal_pass():
    layer = randomize(PrefixLayer(D), seed=3)
    x = torch.randn(1, 11, D)  # [1, L, d]
    whole = layer(x)[0]  # [L, d]
    kv, outs = None, []
    for a, b in [(0, 4), (4, 5), (5, 11)]:
        kv, out = layer.extend(kv, x[0, a:b])
        outs.append(out)
    assert kv.length == 11
    assert_rows_close(torch.cat(outs), whole)  # chunks and one pass: fp32 sums of another order
    # cropping is a rollback: the crop extended by the same rows gives the same output
    kv2, again = layer.extend(kv.crop(6), x[0, 6:])
    assert_rows_close(again, whole[6:])
    assert_rows_close(kv2.keys, kv.keys)
    # and each row sees only its past: changing a later row leaves the earlier outputs alone
    y = x.clone()
    y[0, 8] += 1.0
    changed = layer(y)[0]
    assert_rows_close(changed[:8], whole[:8])
    assert not rows_close(changed[8], whole[8])


def test_hydra_plus_plus_heads_are_hydra_heads_with_a_prefix_layer():
    heads = make_heads(HeadArch("hydra++", K, D, 4, V, V, prefix=True))
    assert isinstance(heads, HydraHeads) and isinstance(heads.prefix, PrefixLayer)
    assert len(heads.blocks[0].blocks) == 4  # 4 layers per head
    assert make_heads(HeadArch("hydra++", K, D, 4, V, V)).prefix is None


def test_the_context_layer_is_refused_where_no_family_reads_it_and_old_dicts_are_kept():
    with pytest.raises(InputError, match="prefix"):
        HeadArch("hydra", K, D, 1, V, V, prefix=True)
    with pytest.raises(InputError, match="prefix"):
        HeadArch("medusa", K, D, 1, V, V, prefix=True)
    with pytest.raises(InputError, match="family"):
        HeadArch("eagle", K, D, 1, V, V)
    # a set without the new option keeps the dict (and so the manifest hash) it had before it existed
    assert HeadArch("hydra", K, D, 1, V, V).as_dict() == {"family": "hydra", "num_heads": K, "hidden_size": D,
                                                          "layers": 1, "vocab_size": V, "draft_vocab": V}
    assert HeadArch("hydra++", K, D, 1, V, V, prefix=True).as_dict()["prefix"] is True
    assert HeadArch(**HeadArch("clover", K, D, 2, V, V, prefix=True).as_dict()).prefix
