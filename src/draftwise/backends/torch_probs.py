"""`SamplingPolicy.probs` on a torch tensor, on the tensor's own device, for every row at once.

A sampled verify needs the policy distribution of every row it visits.  Computing them one
row at a time on the host costs one device sync and one float64 softmax per node; here every
row of a round is done in one batched pass on the device and the caller copies the result
to the host once.

The arithmetic mirrors the NumPy reference step by step, in float64, so that the two agree
to rounding and make the same discrete choices: the first argmax at temperature 0, every
token tied with the k-th largest kept by top-k, and the nucleus cut taken in a stable
ascending order with the reference's `<= 1 - top_p` rule (ties broken by token id).
"""

from __future__ import annotations

import torch

from draftwise.runtime.sampling import SamplingPolicy


def policy_probs(logits: torch.Tensor, policy: SamplingPolicy) -> torch.Tensor:
    """logits [R, V] (any float dtype, any device) -> float64 probs [R, V] on that device."""
    # float64 like the reference: a float32 division by the temperature can create or break the
    # ties that top-k and the nucleus cut decide on
    x = logits.to(torch.float64)  # [R, V]
    if policy.greedy:
        return _first_argmax_one_hot(x)
    scaled = x / policy.temperature  # [R, V]
    if policy.top_k and policy.top_k < scaled.shape[-1]:
        scaled = _top_k(scaled, policy.top_k)
    # max-shifted exp over the sum, as the reference writes it (not torch.softmax, whose fused
    # kernel rounds differently)
    unnormalized = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))  # [R, V]
    probs = unnormalized / unnormalized.sum(dim=-1, keepdim=True)  # [R, V]
    if policy.top_p < 1.0:
        probs = _nucleus(probs, policy.top_p)
    return probs


def _first_argmax_one_hot(x: torch.Tensor) -> torch.Tensor:
    """One-hot [R, V] at the first maximum of each row (torch.argmax returns the first, as NumPy does)."""
    out = torch.zeros_like(x)  # [R, V]
    return out.scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)


def _top_k(scaled: torch.Tensor, k: int) -> torch.Tensor:
    """-inf below the k-th largest value of each row; values tied with it stay (np.partition's rule)."""
    kth = torch.topk(scaled, k, dim=-1).values[..., -1:]  # [R, 1], duplicates counted like np.partition
    return scaled.masked_fill(scaled < kth, float("-inf"))


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper rule, as `sampling._nucleus`: in stable ascending order,
    drop tokens whose cumulative mass is <= 1 - top_p; the largest always stays."""
    ascending, order = torch.sort(probs, dim=-1, stable=True)  # [R, V] each
    drop_sorted = ascending.cumsum(dim=-1) <= (1.0 - top_p)  # [R, V]
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)  # [R, V], back in token order
    kept = probs.masked_fill(drop, 0.0)  # [R, V]
    return kept / kept.sum(dim=-1, keepdim=True)
