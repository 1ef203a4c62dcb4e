"""Head modules: shapes of every depth, Hydra's input width checked, the draft vocabulary's
-inf outside its map, and untrained heads that start as the identity (Medusa) or as the LM
head on the previous state (Hydra)."""

import pytest
import torch

from draftwise.errors import InputError
from draftwise.heads.arch import DraftVocab, HeadArch, HydraHeads, MedusaHeads, make_heads
from tests.helpers import assert_probs_close, assert_rows_close

D, V, K = 12, 40, 3


def arch(family, layers=1, draft_vocab=V):
    return HeadArch(family, K, D, layers, V, draft_vocab)


@pytest.mark.parametrize("layers", [1, 2])
def test_medusa_heads_map_b_by_d_to_b_by_d(layers):
    heads = MedusaHeads(arch("medusa", layers))
    h = torch.randn(5, D)
    for i in range(1, K + 1):
        assert heads.head(i, h).shape == (5, D)
    stacked = heads(h)
    assert stacked.shape == (K, 5, D)
    for i in range(1, K + 1):
        assert torch.equal(stacked[i - 1], heads.head(i, h))


@pytest.mark.parametrize("layers", [1, 2])
def test_hydra_head_i_reads_i_plus_1_vectors(layers):
    heads = HydraHeads(arch("hydra", layers))
    for i in range(1, K + 1):
        assert heads.head(i, torch.randn(4, (i + 1) * D)).shape == (4, D)


@pytest.mark.parametrize("i, width", [(1, D), (1, 3 * D), (2, 2 * D), (3, 3 * D), (3, 5 * D), (2, 3 * D + 1)])
def test_hydra_refuses_a_wrong_input_width(i, width):
    heads = HydraHeads(arch("hydra"))
    with pytest.raises(InputError, match=f"hydra head {i}"):
        heads.head(i, torch.randn(2, width))


def test_make_heads_follows_the_family():
    assert isinstance(make_heads(arch("medusa")), MedusaHeads)
    assert isinstance(make_heads(arch("hydra")), HydraHeads)


@pytest.mark.parametrize("bad", [
    dict(family="eagle"), dict(num_heads=0), dict(layers=0), dict(draft_vocab=0), dict(draft_vocab=V + 1),
])
def test_arch_refuses_impossible_shapes(bad):
    fields = dict(family="medusa", num_heads=K, hidden_size=D, layers=1, vocab_size=V, draft_vocab=V)
    with pytest.raises(InputError):
        HeadArch(**{**fields, **bad})


@pytest.mark.parametrize("layers", [1, 3])
def test_an_untrained_medusa_head_is_the_identity(layers):
    torch.manual_seed(0)
    heads = MedusaHeads(arch("medusa", layers))
    h = torch.randn(6, D)
    for i in range(1, K + 1):
        assert torch.equal(heads.head(i, h), h)


def test_an_untrained_hydra_head_reads_the_previous_state():
    """The projection of the path starts at zero, so head i's state is h_{t-1} itself."""
    torch.manual_seed(0)
    heads = HydraHeads(arch("hydra"))
    for i in range(1, K + 1):
        u = torch.randn(3, (i + 1) * D)
        assert torch.equal(heads.head(i, u), u[:, :D])


def test_draft_vocab_scores_only_its_map_and_puts_minus_inf_elsewhere():
    torch.manual_seed(0)
    lm_head = torch.randn(V, D)
    token_map = torch.tensor([7, 3, 22, 39, 0])
    vocab = DraftVocab(lm_head, token_map)
    x = torch.randn(4, D)
    draft = vocab.logits(x)  # [4, V_d]
    assert draft.shape == (4, 5)
    assert_rows_close(draft, x @ lm_head[token_map].T)  # the same product, maybe another kernel
    full = vocab.full(draft)  # [4, V]
    assert full.shape == (4, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[token_map] = False
    assert torch.isneginf(full[:, outside]).all()
    assert torch.equal(full[:, token_map], draft)
    # the full-vocabulary softmax is the draft softmax placed on the map, zero elsewhere
    p = torch.softmax(full, dim=-1)
    assert_probs_close(p[:, token_map], torch.softmax(draft, dim=-1))
    assert (p[:, outside] == 0).all()
    index = vocab.index_of()
    assert index[token_map].tolist() == [0, 1, 2, 3, 4]
    assert (index[outside] == -1).all()


@pytest.mark.parametrize("token_map", [[1, 1, 2], [0, V], [-1, 3], [[0, 1]]])
def test_draft_vocab_refuses_a_bad_map(token_map):
    with pytest.raises(InputError):
        DraftVocab(torch.randn(V, D), torch.tensor(token_map))
