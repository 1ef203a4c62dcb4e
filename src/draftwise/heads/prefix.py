"""The prefix-attention decoder layer (Hydra++, and Clover's augmenting block: docs/training.md,
"Hydra++ and Clover"): one pre-norm transformer layer over the target's final-norm states of the
whole context, whose output at the frontier row replaces h_{t-1} as the heads' input.

    a = x + O(Attention(Q Norm(x), K Norm(x), V Norm(x)))      causal over the context
    y = a + W_down SiLU(W_up Norm(a))

No rotary position: the target's states already carry their positions, and the causal mask
keeps order; so a row's keys do not depend on where a later chunk starts, and the layer's KV
can be extended row by row.  O and W_down start at zero: an untrained layer is the identity,
so an untrained Hydra++ set reads like Hydra.

At run time the layer keeps its own KV over the committed context (`PrefixKV`): proposal-side
state, never mixed into the target's cache.  Only committed rows enter it (drafted tokens have
no target state), so a rejected round leaves nothing to undo beyond the rows a truncated
context dropped: `crop` to the common prefix, then `extend` with the rows committed since.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftwise.heads.blocks import RMSNorm, attention_heads


@dataclass(frozen=True, eq=False)
class PrefixKV:
    """The layer's keys and values for the first `length` context rows."""

    keys: torch.Tensor  # [H, T, dh]
    values: torch.Tensor  # [H, T, dh]

    @property
    def length(self) -> int:
        return int(self.keys.shape[1])

    def crop(self, length: int) -> "PrefixKV":
        return PrefixKV(self.keys[:, :length], self.values[:, :length])


class PrefixLayer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.heads = attention_heads(d)
        self.d = d
        self.norm_attn = RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.norm_mlp = RMSNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        for zero in (self.out.weight, self.down.weight, self.down.bias):
            nn.init.zeros_(zero)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., L, d] -> q, k, v [..., H, L, dh] each."""
        q, k, v = self.qkv(self.norm_attn(x)).chunk(3, dim=-1)
        shape = (*x.shape[:-1], self.heads, self.d // self.heads)
        return tuple(t.reshape(shape).transpose(-3, -2) for t in (q, k, v))  # type: ignore[return-value]

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x [..., L, d], attended [..., H, L, dh] -> the layer's output [..., L, d]."""
        a = x + self.out(attended.transpose(-3, -2).flatten(-2))
        return a + self.down(nn.functional.silu(self.up(self.norm_mlp(a))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Whole segments at once (training): x [S, L, d] -> [S, L, d], causal within each
        segment.  Padding belongs at the end of a segment: no real row attends to it."""
        q, k, v = self._split(x)  # [S, H, L, dh]
        return self._finish(x, nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))

    def extend(self, kv: PrefixKV | None, x: torch.Tensor) -> tuple[PrefixKV, torch.Tensor]:
        """Rows x [n, d] following the `kv.length` rows already read -> (the KV over all of
        them, the new rows' output [n, d])."""
        q, k, v = self._split(x)  # [H, n, dh]
        if kv is not None and kv.length:
            k, v = torch.cat([kv.keys, k], dim=1), torch.cat([kv.values, v], dim=1)  # [H, T, dh]
        n, total = x.shape[0], k.shape[1]
        visible = torch.arange(total)[None, :] <= torch.arange(total - n, total)[:, None]  # [n, T] causal
        attended = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)  # [H, n, dh]
        return PrefixKV(k, v), self._finish(x, attended)
