"""What a head is trained against, and on which path (docs/training.md, "Draft heads" and
"Hydra++ and Clover").

    L_hard    = sum_i lambda_i CE(q_i, x_{t+i})
    L_teacher = -sum_i lambda_i sum_v p_T(v | x_<=t+i-1) log q_i(v | h, x_t .. x_{t+i-1})

p_T is recomputed from the cached hidden state: the cache holds the target's final-norm state
at every position, and the target's logits there are exactly its LM head applied to it, so
p_T(. | x_<=t+i-1) = softmax(LMHead(hidden[t + i - 1])) without a second target forward and
without a stored top-k (the trade-off measured for the README: a [B, d] x [d, V_d] product per
head per step, against a one-time pass over the stream and a lossy top-k).  Both p_T and q are
over the draft vocabulary: q is zero outside it, so p_T is taken as the target's law
conditioned on the map (its logits restricted to the map's rows), which keeps the loss finite.

Conditioning: teacher forcing feeds head i the true tokens x_t .. x_{t+i-1}; self-conditioning
feeds it x_t and then the earlier heads' own picks (their argmax on the same row, computed
without gradient), the path it will see at run time when its predecessors are wrong.  The
label stays x_{t+i} (and p_T the target's law after the true prefix) either way.
"""

from __future__ import annotations

import torch

from draftwise.errors import InputError
from draftwise.heads.arch import CloverHeads, DraftVocab, HydraHeads, MedusaHeads

CONDITIONING = ("teacher", "self")


def head_states(heads: MedusaHeads | HydraHeads | CloverHeads, embed: torch.Tensor | None, i: int,
                h: torch.Tensor, path: torch.Tensor | None) -> torch.Tensor:
    """Depth i's state [B, d] from the frontier state h [B, d] and (dependent heads) the path's
    token ids [B, i], pending token first."""
    if isinstance(heads, MedusaHeads):
        return heads.head(i, h)
    if embed is None or path is None:
        raise InputError(f"{heads.arch.family} heads read their path's embeddings")
    return heads.path_state(i, h, embed[path])  # embed[path]: [B, i, d]


def conditioned_path(heads: HydraHeads | CloverHeads, vocab: DraftVocab, embed: torch.Tensor, i: int,
                     h: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Self-conditioning: [B, i] token ids, truth[:, 0] (the pending token) then the picks of
    heads 1 .. i - 1, each reading the picks before it."""
    path = truth[:, :1]  # [B, 1]
    with torch.no_grad():
        for j in range(1, i):
            best = vocab.logits(heads.path_state(j, h, embed[path])).argmax(dim=-1)  # [B] draft indices
            path = torch.cat([path, vocab.token_map[best][:, None]], dim=1)  # [B, j + 1]
    return path


def teacher_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_v softmax(teacher)_v log softmax(student)_v; [B, V_d] each."""
    p = torch.softmax(teacher.float(), dim=-1)
    return -(p * torch.log_softmax(student, dim=-1)).sum(dim=-1).mean()
