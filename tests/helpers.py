"""Small builders shared by the tests (no mocks of anything a user would have for real)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from draftwise.runtime.contracts import (
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)

ABSENT_TREE = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)


def result_from_paths(paths: Sequence[Sequence[int]], source: str = "test", manifest_hash: str = "m",
                      contract: ProposerContract = ABSENT_TREE) -> ProposalResult:
    """A trie-shaped proposal (no probabilities) holding every given token path."""
    nodes: list[ProposalNode] = []
    index: dict[tuple[int, ...], int] = {}
    for path in paths:
        for depth in range(1, len(path) + 1):
            prefix = tuple(path[:depth])
            if prefix not in index:
                parent = -1 if depth == 1 else index[prefix[:-1]]
                index[prefix] = len(nodes)
                nodes.append(ProposalNode(token=prefix[-1], parent=parent, depth=depth, source=source))
    return ProposalResult(nodes=tuple(nodes), contract=contract, source=source, manifest_hash=manifest_hash)


class StubProposer:
    """The proposer role's bookkeeping for a test proposer: it learns nothing and keeps no state;
    a subclass writes `propose` (and sets `name`)."""

    name = "stub"
    phase = "propose"

    @property
    def contract(self) -> Any:
        from draftwise.proposers.prompt_lookup import PromptLookupProposer

        return PromptLookupProposer().contract  # deterministic lookup: any exact verifier takes it

    def identity(self) -> dict:
        return {"name": self.name}

    def begin(self, policy: Any, rng: Any) -> None:
        pass

    def observe(self, feedback: Any) -> None:
        pass


class ByteEncoder:
    """A tokenizer stand-in for index tests: UTF-8 bytes are the token ids."""

    name = "bytes"
    vocab_size = 256
    hash = "bytes-v1"

    def encode_batch(self, texts):
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def path_to(round_, row: int) -> list[int]:
    """The rows from the frontier down to `row`, root first ([] for -1): an accepted path."""
    rows: list[int] = []
    while row != -1:
        rows.insert(0, int(row))
        row = int(round_.parent[row])
    return rows


def make_spec(generation: Any = None, **options: Any) -> Any:
    """A DecoderSpec from the same KEY=VALUE options the CLI and the bench take."""
    from draftwise.spec import DecoderSpec
    from draftwise.parse import spec_from_options

    base = DecoderSpec() if generation is None else DecoderSpec(generation=generation)
    return spec_from_options({k: str(v) for k, v in options.items()}, base)


# ---- floating-point comparisons -------------------------------------------------------------------
# The one allowance for "the same rows from another kernel order" (see `assert_rows_close`).
KERNEL_ORDER_FACTOR = 2.0 ** 10


def _eps(dtype: Any) -> float:
    """Machine epsilon of a torch or NumPy floating dtype."""
    if "torch" in type(dtype).__module__:
        import torch

        return float(torch.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def _as_float64(values: Any) -> tuple[np.ndarray, float]:
    """(values as float64 NumPy, the machine epsilon of their dtype)."""
    if hasattr(values, "detach"):  # a torch tensor (bfloat16 has no NumPy dtype: widen in torch)
        import torch

        return values.detach().cpu().to(torch.float64).numpy(), _eps(values.dtype)
    array = np.asarray(values)
    return array.astype(np.float64), _eps(array.dtype)


def assert_rows_close(got: Any, want: Any, what: str = "rows", factor: float = KERNEL_ORDER_FACTOR,
                      computed_in: Any = None) -> None:
    """`got` equals `want` (torch tensors or NumPy arrays, the last axis a row: logits [..., V],
    hidden states [..., d]) within what rounding in another kernel order allows, row by row.

    Both sides compute the same function in the same dtype; only the order in which the kernels
    sum differs (a batched matmul against a lone one, cached attention against a whole-sequence
    pass, AVX-512 blocking against AVX2, another thread split).  Each rounding moves a partial sum
    by at most eps/2 of itself, so a length-K dot product moves by about sqrt(K) eps of its scale
    (K eps at worst), and the normalisations of a network keep every layer's scale: what reaches
    an output row is a modest multiple of eps times the row's scale, its largest |value|.  The
    bound per row is `factor * eps * max|want row|`, eps that of the coarser of the two dtypes.
    Factor 2**10 (1.2e-4 of the scale in fp32): the suite's batched-vs-lone, padded-vs-unpadded,
    cached-vs-whole and draft-vs-reference rows part by at most ~30 eps of their scale on an AMD
    EPYC (AVX2), and by ~25-45 on an Intel Xeon (AVX-512: 1.31e-5 on rows of scale 3-4, which failed
    a fixed atol=1e-5), so the bound stays 20x above what rounding was seen to do.  Real faults
    move a row by its own scale (a mask showing padding, a KV row of another slot, layers handed
    back swapped: 1e5-1e7 eps here), and one value off by 1e-3 of the row's scale, 8x the bound,
    is refused (tests/unit/test_helpers.py).  A row's argmax agrees wherever its top-2 margin
    exceeds twice the bound, as a consequence.  `computed_in` names the dtype the rows were
    computed in where they were widened since (fp32 logits handed on as float64).
    Not for comparisons meant to be bit-identical (the same code path run twice, llama.cpp's
    strict kernels): those compare exactly."""
    problem = rows_differ(got, want, factor, computed_in)
    assert problem is None, f"{what} {problem}"


def assert_probs_close(got: Any, want: Any, what: str = "probabilities", computed_in: Any = np.float32) -> None:
    """Probability rows (a policy's softmax) of logits computed in `computed_in` by kernels of
    another order: compared as log-probabilities, which are the logits shifted by one number (their
    log-sum-exp), so that `assert_rows_close`'s bound carries over; a probability's own error is
    its size times its logit's.  Zeros (cut by top-k, top-p or greedy) must sit at the same places."""
    problem = probs_differ(got, want, computed_in)
    assert problem is None, f"{what} {problem}"


def probs_differ(got: Any, want: Any, computed_in: Any = np.float32) -> str | None:
    """How probability rows depart from `want` beyond `assert_probs_close`'s bound, or None."""
    with np.errstate(divide="ignore"):
        return rows_differ(np.log(_as_float64(got)[0]), np.log(_as_float64(want)[0]), computed_in=computed_in)


def rows_close(got: Any, want: Any, factor: float = KERNEL_ORDER_FACTOR, computed_in: Any = None) -> bool:
    """`assert_rows_close`'s test as a truth value (for checks that combine several)."""
    return rows_differ(got, want, factor, computed_in) is None


def rows_differ(got: Any, want: Any, factor: float = KERNEL_ORDER_FACTOR, computed_in: Any = None) -> str | None:
    """How `got` departs from `want` beyond `assert_rows_close`'s bound, or None where it does not."""
    a, eps_a = _as_float64(got)
    b, eps_b = _as_float64(want)
    if computed_in is not None:
        eps_a = max(eps_a, _eps(computed_in))
    if a.shape != b.shape:
        return f"differ in shape: {a.shape} != {b.shape}"
    if b.size == 0:
        return None
    a, b = a.reshape(-1, b.shape[-1]), b.reshape(-1, b.shape[-1])
    finite = np.isfinite(b)
    if not (np.array_equal(finite, np.isfinite(a)) and np.array_equal(a[~finite], b[~finite], equal_nan=True)):
        return "differ in their infinite or NaN entries"
    a, b = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
    bound = factor * max(eps_a, eps_b) * np.abs(b).max(axis=-1)  # [rows]
    diff = np.abs(a - b).max(axis=-1)
    worst = int(np.argmax(diff - bound))
    if diff[worst] > bound[worst]:
        return f"differ by {diff[worst]:.3g} in row {worst}, over the rounding bound {bound[worst]:.3g}"
    return None


def padding_columns_opened(visible_rows):
    """A planted fault for a transformers batch's mask: `visible_rows` with every real row also
    seeing the columns past its own rows (the padding of a shorter call or of a padded forward)."""
    def leaky(entries, past, width):
        visible = visible_rows(entries, past, width)
        for j, (_, call) in enumerate(entries):
            if call is not None:
                visible[j, : call.rows, past + call.rows :] = True
        return visible
    return leaky
