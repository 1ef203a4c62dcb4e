"""The head modules (docs/drafters.md, "Draft heads") and the draft vocabulary they score.

Medusa: head i maps the frontier state h [B, d] through its own residual blocks; all heads
read the same h, so one stage computes every depth.  Hydra: head i reads
u = concat(h_{t-1}, E(x_t), E(x^_{t+1}), ..., E(x^_{t+i-1})) [B, (i+1) d], so depth i waits
for depth i - 1's choice.  Both end in the target's own (frozen) LM head, restricted to a
draft vocabulary: the rows of the most frequent tokens of the training data (`token_map`),
because the full LM head is a large share of a small model's weights, and so of its cost per
row on a CPU.  q is then zero outside the map and stays normalized over it.

Medusa heads imported from other projects (`interchange`) carry their own LM head per head
instead (`HeadArch.own_lm_head`): [V_d, d] each, rows aligned with the same `token_map`.

Hydra++ (docs/training.md, "Hydra++ and Clover") is Hydra's head with its options: deeper
heads (`layers`), and with `prefix` a prefix-attention decoder layer (`heads.prefix`) over the
context whose output replaces h_{t-1}; its loss options live in the training recipe.  Clover
(`heads.clover`) replaces the widening concatenation by a recurrent state.  Every dependent
family answers `path_state(i, h, path)`: depth i's state from the frontier state and the
embeddings of its path, so training and drafting read the heads through one call.
"""

from __future__ import annotations

import torch
from torch import nn

from draftwise.errors import InputError
from draftwise.heads.blocks import ResBlock
from draftwise.heads.clover import CloverHeads
from draftwise.heads.config import CONTEXT_LAYER, DEPENDENT, FAMILIES, HeadArch
from draftwise.heads.prefix import PrefixLayer

__all__ = ["FAMILIES", "DEPENDENT", "CONTEXT_LAYER", "HeadArch", "ResBlock", "MedusaHeads", "HydraHead", "HydraHeads", "CloverHeads", "DraftVocab", "make_heads"]

class MedusaHeads(nn.Module):
    """K independent heads over one state: [B, d] -> [K, B, d] (the LM head comes after: the
    target's, restricted to the draft vocabulary, or with `own_lm_head` head k's `lm_heads[k]`)."""

    def __init__(self, arch: HeadArch) -> None:
        super().__init__()
        self.arch = arch
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(arch.hidden_size) for _ in range(arch.layers))) for _ in range(arch.num_heads)
        )
        if arch.own_lm_head:  # [V_d, d] each, rows aligned with the head set's token_map
            self.lm_heads = nn.ModuleList(
                nn.Linear(arch.hidden_size, arch.draft_vocab, bias=False) for _ in range(arch.num_heads)
            )

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # h [B, d]
        return torch.stack([block(h) for block in self.blocks])  # [K, B, d]

    def head(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Depth i (1-based) alone: [B, d] -> [B, d]."""
        return self.blocks[i - 1](h)

    def logits(self, states: torch.Tensor, vocab: DraftVocab) -> torch.Tensor:
        """Draft-vocabulary logits of depths 1..D: states [D, ..., d] (row i - 1: depth i's state)
        -> [D, ..., V_d].  Shared LM head: one product for every depth."""
        if not self.arch.own_lm_head:
            return vocab.logits(states)
        return torch.stack([state @ self.lm_heads[i].weight.T for i, state in enumerate(states)])


class HydraHead(nn.Module):
    """One dependent head: [B, (i+1) d] -> [B, d].  The projection adds to h_{t-1} and starts
    at zero (weight and bias), so an untrained head reads like the LM head on the previous state."""

    def __init__(self, d: int, inputs: int, layers: int) -> None:
        super().__init__()
        self.project = nn.Linear(inputs * d, d)
        nn.init.zeros_(self.project.weight)
        nn.init.zeros_(self.project.bias)
        self.blocks = nn.Sequential(*(ResBlock(d) for _ in range(layers)))
        self.d = d

    def forward(self, u: torch.Tensor) -> torch.Tensor:  # u [B, (i+1) d]
        x = u[:, : self.d] + nn.functional.silu(self.project(u))  # [B, d]
        return self.blocks(x)


class HydraHeads(nn.Module):
    """K dependent heads; head i takes (i + 1) vectors: h_{t-1} then i token embeddings.
    Hydra++ with `prefix`: h_{t-1} is first replaced by the prefix layer's output at that row."""

    def __init__(self, arch: HeadArch) -> None:
        super().__init__()
        self.arch = arch
        self.blocks = nn.ModuleList(HydraHead(arch.hidden_size, i + 1, arch.layers) for i in range(1, arch.num_heads + 1))
        self.prefix = PrefixLayer(arch.hidden_size) if arch.prefix else None

    def head(self, i: int, u: torch.Tensor) -> torch.Tensor:
        """Depth i (1-based): u [B, (i+1) d] -> [B, d]."""
        if u.shape[-1] != (i + 1) * self.arch.hidden_size:
            raise InputError(f"hydra head {i} takes {(i + 1)} vectors of {self.arch.hidden_size}, got width {u.shape[-1]}")
        return self.blocks[i - 1](u)

    def path_state(self, i: int, h: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """Depth i from h [B, d] and its path's embeddings [B, i, d] -> [B, d]."""
        return self.head(i, torch.cat([h, path.flatten(1)], dim=1))


def make_heads(arch: HeadArch) -> MedusaHeads | HydraHeads | CloverHeads:
    if arch.family == "clover":
        return CloverHeads(arch)
    return MedusaHeads(arch) if arch.family == "medusa" else HydraHeads(arch)


class DraftVocab(nn.Module):
    """The target's LM head restricted to `token_map` [V_d] (frozen, shared by every head)."""

    def __init__(self, lm_head: torch.Tensor, token_map: torch.Tensor) -> None:  # lm_head [V, d], token_map [V_d]
        super().__init__()
        if token_map.ndim != 1 or int(token_map.max()) >= lm_head.shape[0] or int(token_map.min()) < 0:
            raise InputError(f"token map of shape {tuple(token_map.shape)} does not index a vocabulary of {lm_head.shape[0]}")
        if torch.unique(token_map).numel() != token_map.numel():
            raise InputError("token map lists a token twice")
        self.register_buffer("token_map", token_map.long(), persistent=False)  # [V_d]
        self.register_buffer("rows", lm_head[token_map.long()].float().contiguous(), persistent=False)  # [V_d, d]
        self.vocab_size = int(lm_head.shape[0])

    def logits(self, x: torch.Tensor) -> torch.Tensor:  # x [..., d] -> [..., V_d]
        return x @ self.rows.T

    def full(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[B, V_d] -> [B, V] with -inf outside the map (a probability of exactly zero there)."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.token_map] = draft_logits
        return out

    def index_of(self) -> torch.Tensor:
        """[V] target id -> draft index, -1 outside the map (labels there cannot be predicted)."""
        index = torch.full((self.vocab_size,), -1, dtype=torch.long)
        index[self.token_map] = torch.arange(self.token_map.numel())
        return index
