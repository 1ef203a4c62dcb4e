"""Teacher-forcing rows of a packed stream (HEADS.md section 2), on hand-built streams: rows
never cross a segment boundary, a segment's first token is never an anchor, a fully labelled
segment of length L gives head i max(L - i - 1, 0) rows, the label is never an input, and
unlabelled (prompt) positions are never labels."""

import numpy as np
import pytest
import torch

from draftwise.heads.arch import DraftVocab, HeadArch, HydraHeads, MedusaHeads
from draftwise.training.hidden_cache import HiddenStream
from draftwise.training.rows import anchors, dependent_inputs
from draftwise.training.train import Rows


def packed(lengths, prompt=0):
    """segments [N], labels [N] (the first `prompt` tokens of each segment unlabelled)."""
    segments = np.concatenate([np.full(n, s) for s, n in enumerate(lengths)]).astype(np.int64)
    labels = np.concatenate([np.arange(n) >= prompt for n in lengths])
    return segments, labels


def reference(segments, labels, i):
    """Every (t, i) the definition allows, by brute force."""
    n = len(segments)
    return [t for t in range(1, n - i) if segments[t - 1] == segments[t] == segments[t + i] and labels[t + i]]


@pytest.mark.parametrize("lengths", [[5, 3, 1, 2, 7], [1, 1, 1], [9], [2, 2, 6, 1, 4]])
@pytest.mark.parametrize("i", [1, 2, 3, 4])
def test_fully_labelled_segments_give_max_l_minus_i_minus_1_rows(lengths, i):
    segments, labels = packed(lengths)
    got = anchors(segments, labels, i)
    assert got.dtype == np.int64
    assert len(got) == sum(max(n - i - 1, 0) for n in lengths)
    for s, n in enumerate(lengths):
        assert (segments[got] == s).sum() == max(n - i - 1, 0)
    assert got.tolist() == reference(segments, labels, i)


@pytest.mark.parametrize("i", [1, 2, 3])
def test_no_row_crosses_a_segment_and_no_segment_start_is_an_anchor(i):
    lengths = [4, 6, 2, 5, 3]
    segments, labels = packed(lengths)
    starts = set(np.cumsum([0] + lengths[:-1]).tolist())
    t = anchors(segments, labels, i)
    assert not starts & set(t.tolist())  # hidden[t - 1] would belong to the previous document
    assert (segments[t - 1] == segments[t]).all()
    assert (segments[t + i] == segments[t]).all()
    # every position that the definition allows is there (skipped, not clamped: nothing else)
    assert t.tolist() == reference(segments, labels, i)


def test_unlabelled_positions_are_never_labels():
    lengths = [6, 4, 8]
    segments, labels = packed(lengths, prompt=3)
    for i in (1, 2, 3):
        t = anchors(segments, labels, i)
        assert labels[t + i].all()
        assert t.tolist() == reference(segments, labels, i)
    # a segment with 3 prompt tokens and L - 3 labels: head 1's labels are positions 3..L-1 of it
    t = anchors(segments, labels, 1)
    assert (t[segments[t] == 0] + 1).tolist() == [3, 4, 5]


def test_random_streams_match_the_definition():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 9, size=int(rng.integers(1, 8))).tolist()
        segments, _ = packed(lengths)
        labels = rng.random(len(segments)) < 0.6
        for i in (1, 2, 3, 5):
            assert anchors(segments, labels, i).tolist() == reference(segments, labels, i)


def test_heads_are_numbered_from_one():
    segments, labels = packed([5])
    with pytest.raises(ValueError):
        anchors(segments, labels, 0)


@pytest.mark.parametrize("i", [1, 2, 3])
def test_dependent_inputs_are_tokens_t_to_t_plus_i_minus_1_never_the_label(i):
    lengths = [7, 5, 9]
    segments, labels = packed(lengths)
    tokens = np.arange(len(segments)) + 100  # token = 100 + position: inputs name their positions
    t = anchors(segments, labels, i)
    inputs = dependent_inputs(tokens, t, i)  # [R, i]
    assert inputs.shape == (len(t), i)
    for row, anchor in zip(inputs, t):
        assert (row - 100).tolist() == list(range(anchor, anchor + i))
        assert tokens[anchor + i] not in row  # the label
        assert tokens[anchor - 1] not in row  # the hidden row's own token comes through hidden[t - 1]


def test_training_rows_pair_hidden_t_minus_1_and_path_embeddings_with_label_t_plus_i():
    """train.Rows builds head i's input from hidden[t - 1] (and, for Hydra, E(tokens[t..t+i-1]))
    and its label from tokens[t + i], mapped into the draft vocabulary."""
    lengths, d, v = [6, 5], 4, 32
    segments, labels = packed(lengths, prompt=1)
    n = len(segments)
    tokens = np.arange(n, dtype=np.int64) + 3  # distinct ids: position p holds token p + 3
    hidden = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, d).to(torch.bfloat16)  # row p = p
    stream = HiddenStream(tokens, segments, labels, hidden, {"train": np.array([0, 1])}, "h", {})
    token_map = torch.tensor([10, 4, 7, 5, 6, 8, 9, 12, 11])  # some labels fall outside
    embed = torch.arange(v, dtype=torch.float32)[:, None].repeat(1, d) * 1000  # E(x) = 1000 x
    vocab = DraftVocab(torch.zeros(v, d), token_map)

    class Echo(torch.nn.Module):  # returns its input: the test reads what a head is given
        def head(self, i, u):
            return u

    for family in ("medusa", "hydra"):
        arch = HeadArch(family, 3, d, 1, v, len(token_map))
        rows = Rows(stream, arch, vocab.index_of())
        for i in (1, 2, 3):
            t = rows.anchors[i]
            expected_label = [token_map.tolist().index(x) if x in token_map.tolist() else -1 for x in tokens[t + i]]
            assert rows.labels[i].tolist() == expected_label
            if family == "medusa":
                heads = MedusaHeads(arch)
                heads.head = Echo().head  # type: ignore[method-assign]
                got = rows.inputs(heads, None, i, np.arange(len(t)))
                assert got[:, 0].tolist() == (t - 1).tolist()
            else:
                heads = HydraHeads(arch)
                heads.head = Echo().head  # type: ignore[method-assign]
                got = rows.inputs(heads, embed, i, np.arange(len(t)))  # [R, (i + 1) d]
                assert got.shape == (len(t), (i + 1) * d)
                assert got[:, 0].tolist() == (t - 1).tolist()
                path = got[:, d::d] / 1000  # the embedded token ids, in order
                assert path.tolist() == [list(tokens[a : a + i]) for a in t]
                assert all(tokens[a + i] not in row for a, row in zip(t, path.tolist()))
