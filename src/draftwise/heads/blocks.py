"""Small layers the head families share."""

from __future__ import annotations

import torch
from torch import nn


class ResBlock(nn.Module):
    """x + SiLU(W x + b); W and b start at zero, so an untrained block is the identity (with
    nn.Linear's random bias it would add SiLU(b) to every state)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., d]
        return x + nn.functional.silu(self.linear(x))


class RMSNorm(nn.Module):
    """x / rms(x) * w, computed in float32 (the target's own norm form; eps as Llama's)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., d]
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def attention_heads(d: int) -> int:
    """Attention heads of width 64 where d allows (576 -> 9), else one head: fixed by d alone,
    so an artifact's shapes follow from its HeadArch."""
    return d // 64 if d % 64 == 0 and d >= 64 else 1
