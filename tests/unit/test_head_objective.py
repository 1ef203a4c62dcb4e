"""What heads are trained against: L_teacher against a hand computation, the teacher read at
position t + i - 1 (the target's law for the label x_{t+i}, not one row off), the loss mixing
by weights, and self-conditioning feeding the earlier heads' own picks (mapped back from the
draft vocabulary) where teacher forcing feeds the true tokens."""

import math

import numpy as np
import pytest
import torch

from draftwise.errors import InputError
from draftwise.heads.arch import DraftVocab, HeadArch
from draftwise.training.hidden_cache import HiddenStream
from draftwise.training.objective import conditioned_path, teacher_loss
from draftwise.training.train import Rows, TrainRecipe, step_loss, stream_frontier


def test_teacher_loss_matches_a_hand_computed_value():
    teacher = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # p = [1/2, 1/2] and [3/4, 1/4]
    student = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])  # q = [1/4, 3/4] and [1/2, 1/2]
    row1 = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))  # 0.5 ln(16/3) = 0.83698
    row2 = -(0.75 * math.log(0.5) + 0.25 * math.log(0.5))  # ln 2
    # fp32 softmaxes of two values and a mean: a few roundings of a loss near 0.77 (eps 1.2e-7)
    assert teacher_loss(student, teacher).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)
    # the loss is the cross-entropy: it is smallest (the teacher's entropy) where q = p
    assert teacher_loss(teacher, teacher).item() < teacher_loss(student, teacher).item()


def stream_with_positions(n: int = 12, d: int = 6) -> HiddenStream:
    tokens = (np.arange(n) % d).astype(np.int64)
    hidden = torch.zeros(n, d)
    hidden[torch.arange(n), torch.arange(n) % d] = torch.arange(n, dtype=torch.float32) + 1  # row p: (p+1) e_{p % d}
    return HiddenStream(tokens, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool), hidden.to(torch.bfloat16),
                        {"train": np.array([0])}, "h", {})


def test_the_teacher_is_the_target_law_at_position_t_plus_i_minus_1():
    d = 6
    stream = stream_with_positions(d=d)
    vocab = DraftVocab(torch.eye(d), torch.arange(d))  # LM head = identity: logits = the hidden row
    rows = Rows(stream, HeadArch("hydra", 3, d, 1, d, d), vocab.index_of())
    for i in (1, 2, 3):
        pick = np.arange(len(rows.anchors[i]))
        teacher = rows.teacher(vocab, i, pick)  # [B, d]
        expected = stream.hidden[torch.from_numpy(rows.anchors[i] + i - 1)].float()
        assert torch.equal(teacher, expected)


def test_the_losses_mix_by_their_weights():
    d = 6
    stream = stream_with_positions(d=d)
    g = torch.Generator().manual_seed(0)
    lm_head = torch.randn(d, d, generator=g)
    vocab = DraftVocab(lm_head, torch.arange(d))
    arch = HeadArch("hydra", 2, d, 1, d, d)
    from draftwise.heads.arch import make_heads
    heads = make_heads(arch)
    embed = torch.randn(d, d, generator=g)
    rows = Rows(stream, arch, vocab.index_of())
    picks = {i: np.arange(len(rows.anchors[i])) for i in (1, 2)}
    frontier = stream_frontier(stream)

    def loss(**weights):
        recipe = TrainRecipe(family="hydra", num_heads=2, draft_vocab=d, **weights)
        with torch.no_grad():
            return step_loss(heads, vocab, embed, rows, recipe, picks, frontier, [1.0, 0.5]).item()

    hard, teacher = loss(), loss(hard_weight=0.0, teacher_weight=1.0)
    assert hard != pytest.approx(teacher)
    assert loss(hard_weight=0.3, teacher_weight=2.0) == pytest.approx(0.3 * hard + 2.0 * teacher, rel=1e-5)
    with pytest.raises(InputError, match="loss weights"):
        TrainRecipe(hard_weight=0.0, teacher_weight=0.0)
    with pytest.raises(InputError, match="medusa"):
        TrainRecipe(family="medusa", conditioning="self")


class LastToken(torch.nn.Module):
    """A 'head' whose state is its path's last embedding: with E = I and the LM head = I, its
    pick is the last token of the path it was given."""

    def path_state(self, i, h, path):  # path [B, i, d]
        return path[:, -1]


def test_self_conditioning_feeds_the_earlier_heads_picks():
    d = 5
    token_map = torch.tensor([3, 0, 4, 1, 2])  # draft index -> target id, not the identity
    vocab = DraftVocab(torch.eye(d), token_map)
    truth = torch.tensor([[2, 4, 1], [0, 3, 3]])  # [B, 3]: pending token, then the true continuation
    path = conditioned_path(LastToken(), vocab, torch.eye(d), 3, torch.zeros(2, d), truth)  # type: ignore[arg-type]
    # head 1 picks the pending token itself (its state is E(x_t)), head 2 then picks it again
    assert path.tolist() == [[2, 2, 2], [0, 0, 0]]
