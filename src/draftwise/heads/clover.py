"""Clover heads (docs/training.md, "Hydra++ and Clover"): a recurrent draft state of fixed width
instead of Hydra's ever wider concatenation.

    h_0 = the target state h_{t-1}        (after the augmenting block, with `prefix`)
    h_i = h_{i-1} + Gate(Q_i, K_i) * V_i     Q_i = W_Q Norm(h_{i-1}),  K_i = W_K E(x_{t+i-1}),  V_i = W_V E(x_{t+i-1})
    q_i = softmax(LMHead(Predictor_i(h_i)))

x_t is the pending token, x_{t+i-1} (i >= 2) the token drafted at depth i - 1 on the path.

The gate, a form chosen here: per attention head, the cosine
similarity of that head's slices of Q_i and K_i, which multiplies the head's slice of V_i.
There is a single key per step, so a softmax over keys would be identically 1 and drop Q and K
altogether; the cosine keeps the query-key interaction, is bounded in [-1, 1] (a recurrence
applied K times cannot blow up through it) and needs no temperature.  The official Clover-2
code gates its regressive block the same way (read, not copied).  The regressive block is
shared by every depth (the recurrence is one cell); each depth has its own predictor (residual
blocks) before the target's LM head, shared by every depth.  W_V starts at zero, so an
untrained step leaves the state unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from draftwise.errors import InputError
from draftwise.heads.blocks import ResBlock, RMSNorm, attention_heads
from draftwise.heads.config import HeadArch
from draftwise.heads.prefix import PrefixLayer


class RegressiveAttention(nn.Module):
    """One recurrence step: h [B, d], e (the previous token's embedding) [B, d] -> [B, d]."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.heads = attention_heads(d)
        self.norm = RMSNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        nn.init.zeros_(self.v.weight)
        nn.init.zeros_(self.v.bias)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        split = (*h.shape[:-1], self.heads, h.shape[-1] // self.heads)
        q = self.q(self.norm(h)).reshape(split)  # [B, H, dh]
        k = self.k(e).reshape(split)  # [B, H, dh]
        gate = nn.functional.cosine_similarity(q, k, dim=-1, eps=1e-6)  # [B, H]
        return h + (gate[..., None] * self.v(e).reshape(split)).flatten(-2)  # [B, d]


class CloverHeads(nn.Module):
    def __init__(self, arch: HeadArch) -> None:
        super().__init__()
        self.arch = arch
        d = arch.hidden_size
        self.regressive = RegressiveAttention(d)
        self.predictors = nn.ModuleList(nn.Sequential(*(ResBlock(d) for _ in range(arch.layers)))
                                        for _ in range(arch.num_heads))
        self.prefix = PrefixLayer(d) if arch.prefix else None  # the augmenting block over the context

    def step(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """h_{i-1} [B, d], E(x_{t+i-1}) [B, d] -> h_i [B, d]."""
        return self.regressive(h, e)

    def predict(self, i: int, state: torch.Tensor) -> torch.Tensor:
        """Depth i's predictor: h_i [B, d] -> [B, d] (the LM head comes after)."""
        if not 1 <= i <= self.arch.num_heads:
            raise InputError(f"clover has depths 1..{self.arch.num_heads}, not {i}")
        return self.predictors[i - 1](state)

    def path_state(self, i: int, h: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """Depth i from h_0 [B, d] and its path's embeddings [B, i, d] -> [B, d]."""
        if path.shape[1] != i:
            raise InputError(f"clover depth {i} reads {i} path embeddings, got {path.shape[1]}")
        state = h
        for j in range(i):
            state = self.step(state, path[:, j])  # [B, d]
        return self.predict(i, state)
