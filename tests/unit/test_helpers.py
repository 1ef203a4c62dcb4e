"""The suite's own tolerance (`tests.helpers.assert_rows_close`): it passes what rounding in
another kernel order does to a network's rows and refuses the differences real faults make."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import KERNEL_ORDER_FACTOR, assert_probs_close, assert_rows_close


def network_rows(dtype: torch.dtype, seed: int = 0, rows: int = 6, width: int = 576, vocab: int = 2048) -> torch.Tensor:
    """Logits of a small random residual network (RMS-normalised layers, then a head): [rows, vocab]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    layers = [torch.randn(width, width, generator=g, dtype=torch.float64) / width ** 0.5 for _ in range(4)]
    head = torch.randn(width, vocab, generator=g, dtype=torch.float64) / width ** 0.5 * 4
    x = x.to(dtype)
    for w in layers:
        x = x + torch.nn.functional.rms_norm(x, (width,)) @ w.to(dtype)
    return torch.nn.functional.rms_norm(x, (width,)) @ head.to(dtype)


def test_rows_from_another_summation_order_pass():
    """fp32 rows against the same network in float64 (every sum exact to fp32's eye): a rounding
    spread at least as wide as any two fp32 kernel orders make, far inside the bound."""
    want = network_rows(torch.float64)
    got = network_rows(torch.float32)
    assert_rows_close(got, want)
    spread = ((got.double() - want).abs().amax(-1) / want.abs().amax(-1)).max().item() / torch.finfo(torch.float32).eps
    assert spread < KERNEL_ORDER_FACTOR / 8, spread
    # a batched matmul against one row at a time (another blocking), NumPy arrays as well
    x, w = np.random.default_rng(1).standard_normal((2, 8, 576), dtype=np.float32)[0], \
        np.random.default_rng(2).standard_normal((576, 1000), dtype=np.float32)
    assert_rows_close(np.stack([row @ w for row in x]), x @ w, "one row at a time")


def planted(want: torch.Tensor, fault: str) -> torch.Tensor:
    got = want.clone()
    if fault == "one row shifted":  # a row read from the next position (an off-by-one KV row, say)
        got[3] = want[4]
    elif fault == "one logit off by 1e-3":
        got[2, 17] += 1e-3 * want[2].abs().max()
    elif fault == "rows in half precision":  # a verify that ran in bfloat16 against an fp32 reference
        got = want.to(torch.bfloat16).to(torch.float32)
    elif fault == "a masked entry unmasked":
        got[1, 5] = -torch.inf
    return got


@pytest.mark.parametrize("fault", ["one row shifted", "one logit off by 1e-3", "rows in half precision",
                                   "a masked entry unmasked"])
def test_planted_faults_are_refused(fault):
    want = network_rows(torch.float32)
    with pytest.raises(AssertionError, match="differ"):
        assert_rows_close(planted(want, fault), want, "logits")


def test_the_bound_follows_each_rows_scale_and_the_coarser_dtype():
    want = network_rows(torch.float32)
    small = want.clone()
    small[0] *= 1e-3  # a row a thousand times smaller: a shift that the big rows would absorb is refused there
    got = small.clone()
    got[0, 0] += 1e-3 * small[0].abs().max()
    with pytest.raises(AssertionError, match="row 0"):
        assert_rows_close(got, small)
    # bfloat16 rows carry bfloat16's epsilon: rounding an fp32 row to them is within the bound
    assert_rows_close(want.to(torch.bfloat16), want)
    with pytest.raises(AssertionError, match="shape"):
        assert_rows_close(want[:-1], want)


def test_probabilities_compare_through_their_logits():
    """A policy's probabilities of fp32 rows against those of the exact rows pass; a law at
    another temperature, one probability moved by 1% of itself (1e-2 in log space, on rows whose
    log-probabilities reach -10: the bound allows 1.2e-3 there), or a top-k cut elsewhere do not."""
    from draftwise.runtime.sampling import SamplingPolicy

    exact = network_rows(torch.float64).numpy()
    rounded = network_rows(torch.float32).numpy()
    policy = SamplingPolicy(temperature=0.7, top_k=50)
    want = policy.probs(exact)
    assert_probs_close(policy.probs(rounded), want)
    hotter = SamplingPolicy(temperature=0.71, top_k=50).probs(exact)
    moved = want.copy()
    moved[0, int(np.argmax(want[0]))] *= 1 + 1e-2
    other_cut = SamplingPolicy(temperature=0.7, top_k=49).probs(exact)
    for fault in (hotter, moved, other_cut):
        with pytest.raises(AssertionError, match="differ"):
            assert_probs_close(fault, want)
