"""llama.cpp's batch invariance, probed, and strict mode: verify rows bit-identical to plain decoding.

The default kernels are not batch-invariant (the probe finds rows that differ from one-row
decoding); with STRICT_TREE_KERNELS the probe finds every probed row bit-identical, and then every
drafter's greedy output is EXACTLY plain decoding's (no near-tie allowance, unlike
test_llamacpp_engine.py): prompt lookup (chain and tree), the cost gate, REST and a draft model,
on the Spec-Bench development prompts (conftest.REAL_PROMPTS).  With STRICT_CHAIN_KERNELS (flash attention off) chains
are bit-identical and trees are not, and the chain drafters equal their plain decoding exactly.
A planted fault (one verify row moved by 1e-6) is what the probe must catch.
"""

import logging

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.measure.invariance import (  # noqa: E402
    InvarianceCase,
    InvarianceProbe,
    cached_probe,
    find_divergence,
    load_strict,
    probe_invariance,
)
from draftwise.backends.llamacpp import (  # noqa: E402
    DEFAULT_KERNELS,
    STRICT_CHAIN_KERNELS,
    STRICT_TREE_KERNELS,
    LlamaCppBackend,
)
from draftwise.runtime.cost_profile import VerifyCostProfile  # noqa: E402
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder  # noqa: E402
from draftwise.runtime.gate import CostGateConfig  # noqa: E402
from draftwise.runtime.logits import NumpyLogits  # noqa: E402
from draftwise.models import resolve  # noqa: E402
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer  # noqa: E402
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer  # noqa: E402
from draftwise.proposers.retrieval.index import build_from_token_documents  # noqa: E402
from draftwise.proposers.retrieval.proposer import RestProposer  # noqa: E402
from draftwise.verify.greedy import GreedyVerifier  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]
NEW = 32
CONFIG = GenerationConfig(max_new_tokens=NEW)
SMALL = dict(prefixes=(40, 300), sizes=(2, 3, 5, 9, 16))


@pytest.fixture(scope="module")
def strict():
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    # what load_strict builds, without its full probe (minutes on two cores; its smaller
    # version is test_strict_kernels_are_bit_identical_for_chains_and_trees): rounds capped at 16
    backend = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=2, n_ctx=2048, kernels=STRICT_TREE_KERNELS)
    backend.cap_verify_rows(16)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def strict_chains():
    backend = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=2, n_ctx=2048, kernels=STRICT_CHAIN_KERNELS)
    backend.cap_verify_rows(16)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def default_backend():
    backend = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=2, n_ctx=2048)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompts_and_plain(strict, spec_bench_prompts):
    prompts = [strict.chat_prompt([{"role": "user", "content": t}]) for t in spec_bench_prompts]
    return prompts, [SpeculativeDecoder(strict, [], GreedyVerifier(), CONFIG).generate(p).tokens for p in prompts]


def test_default_kernels_are_not_batch_invariant(default_backend):
    probe = probe_invariance(default_backend, prefixes=(256,), sizes=(2, 4))
    assert default_backend.kernels == DEFAULT_KERNELS
    # a one-row plain step and a verify take different attention kernels (measured: 0.4-1.2 in a
    # logit after 100-1000 tokens, 0 after 40), and a tree row's cells group differently into lanes
    assert not probe.bit_identical and probe.exact_rows < 4 and 0.05 < probe.max_abs_diff < 5
    assert "exact up to kernel rounding" in probe.statement()


def test_strict_kernels_are_bit_identical_for_chains_and_trees(strict):
    assert strict.kernels == STRICT_TREE_KERNELS
    probe = probe_invariance(strict, **SMALL)
    assert {c.shape for c in probe.cases} == {"chain", "tree"} and len(probe.cases) == 20
    assert probe.bit_identical, [c for c in probe.cases if c.max_abs_diff]
    assert "by construction" in probe.statement()


def test_strict_chain_kernels_are_bit_identical_for_chains_only(strict_chains):
    """Flash attention off, >= 2-row decodes: a chain's cells follow the committed ones, so its
    rows equal plain decoding's; a tree's ancestors are scattered, so some of its rows do not
    (measured on this model: up to 0.3-0.8 for 5-16-row trees after 256-1000 tokens)."""
    probe = probe_invariance(strict_chains, prefixes=(40, 300), sizes=(2, 3, 5, 9, 16))
    chains = [c for c in probe.cases if c.shape == "chain"]
    assert len(chains) == 10 and all(c.max_abs_diff == 0.0 for c in chains), chains
    assert any(c.max_abs_diff > 0 for c in probe.cases if c.shape == "tree")
    only = probe_invariance(strict_chains, prefixes=(300,), sizes=(2, 9), shapes=("chain",))
    assert only.bit_identical and {c.shape for c in only.cases} == {"chain"}
    assert "chains of 2-9 rows" in only.statement() and "trees" not in only.statement()


@pytest.mark.parametrize("proposer", ["lookup", "gate", "draft"])
def test_chain_drafters_are_exactly_plain_under_chain_kernels(strict_chains, spec_bench_prompts, proposer):
    prompts = [strict_chains.chat_prompt([{"role": "user", "content": t}]) for t in spec_bench_prompts[:4]]
    plain = [SpeculativeDecoder(strict_chains, [], GreedyVerifier(), CONFIG).generate(p).tokens for p in prompts]
    config = CONFIG
    if proposer == "gate":
        profile = VerifyCostProfile(rows=tuple(range(1, 17)), relative=(1.0,) + (1.6,) * 15, absolute_s=None,
                                    model="smollm2-135m", backend="llamacpp", threads=2, machine="test")
        config = GenerationConfig(max_new_tokens=NEW, gate=CostGateConfig(profile))
    draft = None
    if proposer == "draft":
        draft = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=2, n_ctx=2048)
        chosen = DraftModelProposer(draft, strict_chains.info.tokenizer_hash, DraftConfig(k=4, confidence_threshold=0.0))
    else:
        chosen = PromptLookupProposer(PromptLookupConfig())
    try:
        drafted = 0
        for prompt, reference in zip(prompts, plain):
            result = SpeculativeDecoder(strict_chains, [chosen], GreedyVerifier(), config).generate(prompt)
            assert result.tokens == reference
            drafted += sum(result.from_draft)
        assert drafted > 0
    finally:
        if draft is not None:
            draft.close()


class _Perturbed:
    """A strict backend whose multi-row verifies move one logit of the last row by 1e-6."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def verify(self, pending, round_, unread=()):
        logits = self._inner.verify(pending, round_, unread)
        if round_ is None:
            return logits
        rows = np.array(logits.logits, dtype=np.float32)
        rows[-1, 7] += 1e-6 * max(1.0, abs(rows[-1, 7]))
        return NumpyLogits(rows)


def test_probe_catches_a_row_one_ulp_off(strict):
    probe = probe_invariance(_Perturbed(strict), prefixes=(40,), sizes=(2, 3))
    assert not probe.bit_identical and probe.exact_rows == 1 and 0 < probe.max_abs_diff < 1e-3


def test_a_commit_through_a_leaf_grown_from_a_chain_keeps_only_the_accepted_path(strict):
    """A chain verified, then grown into a tree (`verify_more`), and committed through a new
    leaf: the chain's rejected row must leave the committed text (a kept one sits at the same
    position as an accepted row and moves the next logits by several units), also while the
    graveyard holds rejected cells."""
    from tests.integration.test_llamacpp_backend import make_round

    prompt = strict.tokenize("def add(a, b):\n    return a + b\n", add_special=False)
    strict.reserve(4)
    strict.reset()
    strict.extend(prompt[:-1])
    t = strict.cached_len
    strict.verify(prompt[-1], make_round(t + 1, [(800, -1), (801, 0)]))  # a chain: the main sequence holds it
    strict.verify_more(make_round(t + 1, [(800, -1), (801, 0), (802, 0), (803, 1), (804, 2)]), 2)
    strict.commit([0, 2, 4])  # 800 -> 802 -> 804: 801 is rejected
    got = np.array(strict.verify(5, None).logits[0])
    strict.rollback()
    strict.reset()
    want = np.array(strict.extend(list(prompt) + [800, 802, 804, 5]).logits[0])
    strict.reset()
    assert float(np.max(np.abs(got - want))) < 1.0


def test_strict_keeps_no_pad_cell(strict):
    """The throwaway row a one-row decode is padded with leaves no cell behind."""
    import llama_cpp

    prompt = strict.tokenize("def add(a, b):\n    return a + b\n", add_special=False)
    strict.reset()
    strict.extend(prompt[:-1])
    strict.verify(prompt[-1], None)
    strict.commit(())
    assert llama_cpp.llama_memory_seq_pos_max(strict.batch._mem, 0) == len(prompt) - 1 == strict.cached_len - 1
    strict.reset()


@pytest.mark.parametrize("candidates", [1, 4])
def test_prompt_lookup_is_exactly_plain(strict, prompts_and_plain, candidates):
    prompts, plain = prompts_and_plain
    proposer = PromptLookupProposer(PromptLookupConfig(max_candidates=candidates))
    drafted = 0
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(strict, [proposer], GreedyVerifier(), CONFIG).generate(prompt)
        assert result.tokens == reference
        drafted += sum(result.from_draft)
    assert drafted > 0


def test_cost_gate_is_exactly_plain(strict, prompts_and_plain):
    prompts, plain = prompts_and_plain
    profile = VerifyCostProfile(rows=tuple(range(1, 17)), relative=(1.0,) + (1.6,) * 15, absolute_s=None,
                                model="smollm2-135m", backend="llamacpp", threads=2, machine="test")
    config = GenerationConfig(max_new_tokens=NEW, gate=CostGateConfig(profile))
    gated = speculated = 0
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(strict, [PromptLookupProposer(PromptLookupConfig())], GreedyVerifier(), config).generate(prompt)
        assert result.tokens == reference
        gated += result.stats.gated_rounds
        speculated += sum(r.nodes > 0 for r in result.records)
    assert gated > 0 and speculated > 0


def test_rest_is_exactly_plain(strict, prompts_and_plain, tmp_path):
    prompts, plain = prompts_and_plain
    build_from_token_documents([list(t) for t in plain[::2]], tmp_path / "idx", strict.info.vocab_size,
                               strict.info.tokenizer_hash)
    proposer = RestProposer.open(tmp_path / "idx", strict.info.tokenizer_hash)
    drafted = 0
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(strict, [proposer], GreedyVerifier(), CONFIG).generate(prompt)
        assert result.tokens == reference
        drafted += sum(result.from_draft)
    assert drafted > 0


def test_draft_model_is_exactly_plain(strict, prompts_and_plain):
    prompts, plain = prompts_and_plain
    draft = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=2, n_ctx=2048)  # default kernels: drafts only propose
    try:
        proposer = DraftModelProposer(draft, strict.info.tokenizer_hash, DraftConfig(k=4, confidence_threshold=0.0))
        for prompt, reference in zip(prompts[:5], plain[:5]):
            assert SpeculativeDecoder(strict, [proposer], GreedyVerifier(), CONFIG).generate(prompt).tokens == reference
    finally:
        draft.close()


def test_rounds_are_capped_at_the_probed_rows(strict, tmp_path):
    """A strict target verifies no more rows than its probe measured exact: the engine's rounds
    stay under the cap, and a larger round handed to the backend is refused."""
    from draftwise.backends.base import BackendError
    from draftwise.measure.profile import chain_round

    cap = strict.info.max_verify_rows
    strict.reset()
    strict.extend([1, 2, 3])
    with pytest.raises(BackendError, match="exceeds"):
        strict.verify(4, chain_round(4, cap, strict.info.vocab_size))
    strict.reset()


def test_cached_probe_is_reused_and_a_tampered_one_remeasured(strict, tmp_path, monkeypatch):
    import draftwise.measure.invariance as invariance

    fake = InvarianceProbe("m", "llamacpp", "k", 2, "x", (InvarianceCase(40, "chain", 2, 0.0),))
    calls = []
    monkeypatch.setattr(invariance, "probe_invariance", lambda backend, shapes: calls.append(shapes) or fake)
    assert cached_probe(strict, tmp_path) == fake and cached_probe(strict, tmp_path) == fake and len(calls) == 1
    (data,) = list(tmp_path.glob("*/invariance.json"))
    data.write_text(data.read_text().replace('"rows": 2', '"rows": 3'))  # the manifest's checksum no longer holds
    assert cached_probe(strict, tmp_path) == fake and len(calls) == 2
    # a chains-only probe is another artifact (the full probe's key is unchanged)
    assert cached_probe(strict, tmp_path, ("chain",)) == fake and calls[-1] == ("chain",) and len(calls) == 3


class _Logits:
    """A stand-in backend whose plain step returns fixed logits (for the near-tie rule alone)."""

    def __init__(self, logits):
        self.logits = np.asarray(logits, dtype=np.float32)

    def reset(self):
        pass

    def extend(self, tokens):
        pass

    def verify(self, pending, round_):
        return NumpyLogits(self.logits[None])

    def rollback(self):
        pass


def test_divergence_is_a_near_tie_only_within_the_probe_bound():
    probe = InvarianceProbe("m", "llamacpp", "k", 2, "x", (InvarianceCase(40, "chain", 2, 0.5),))  # bound 1.0
    assert find_divergence(_Logits([0, 3.0, 2.2]), [1, 2], [5, 6], [5, 6], probe) is None
    tie = find_divergence(_Logits([0, 3.0, 2.2]), [1, 2], [5, 7, 1], [5, 6, 1], probe)
    assert tie.token_index == 1 and tie.near_tie and abs(tie.plain_margin - 0.8) < 1e-6
    clear = find_divergence(_Logits([0, 3.0, 1.5]), [1, 2], [5, 7], [5, 6], probe)
    assert not clear.near_tie and "NOT explained" in clear.describe()


def _fake_probe(diffs: dict[int, float]) -> InvarianceProbe:
    return InvarianceProbe("m", "llamacpp", "k", 2, "x", tuple(InvarianceCase(40, "chain", n, d) for n, d in diffs.items()))


def test_load_strict_caps_rounds_at_the_probe_or_refuses(tmp_path, monkeypatch):
    import draftwise.measure.invariance as invariance
    from draftwise.backends.base import BackendError

    monkeypatch.setattr(invariance, "probe_invariance", lambda backend, shapes: _fake_probe({2: 0.0, 5: 0.0, 8: 0.4}))
    backend = load_strict(resolve("smollm2-135m"), threads=2, root=tmp_path / "a")
    try:
        assert backend.kernels == STRICT_TREE_KERNELS and backend.info.max_verify_rows == 5
        assert backend.info.dtype != "gguf"  # its verify profiles and calibrations are keyed apart
    finally:
        backend.close()
    monkeypatch.setattr(invariance, "probe_invariance", lambda backend, shapes: _fake_probe({2: 0.3, 4: 0.5}))
    with pytest.raises(BackendError, match="even 2 rows differ"):
        load_strict(resolve("smollm2-135m"), threads=2, root=tmp_path / "b")


def test_load_strict_for_chains_keeps_the_kernels_exact_up_to_more_rows(tmp_path, monkeypatch):
    """Chains: repacked weights first; unpacked ones only when the first fall short, and the
    better measured wins (Q4_K's repacked gemm splits rows 4 by 4, its unpacked one at 8)."""
    import dataclasses

    import draftwise.measure.invariance as invariance

    seen = []

    def probe(backend, shapes):
        seen.append((backend.kernels, shapes))
        return _fake_probe({2: 0.0, 3: 0.0, 4: 0.2} if backend.kernels.repack else {2: 0.0, 7: 0.0, 8: 0.4})

    monkeypatch.setattr(invariance, "probe_invariance", probe)
    backend = load_strict(resolve("smollm2-135m"), threads=2, root=tmp_path / "c", scope="chains")
    try:
        unpacked = dataclasses.replace(STRICT_CHAIN_KERNELS, repack=False)
        assert seen == [(STRICT_CHAIN_KERNELS, ("chain",)), (unpacked, ("chain",))]
        assert backend.kernels == unpacked and backend.info.max_verify_rows == 7
    finally:
        backend.close()
    seen.clear()
    monkeypatch.setattr(invariance, "probe_invariance", lambda backend, shapes: seen.append(1) or _fake_probe({2: 0.0, 16: 0.0}))
    backend = load_strict(resolve("smollm2-135m"), threads=2, root=tmp_path / "d", scope="chains")
    try:  # exact at every probed size: the faster kernels are kept without probing the others
        assert backend.kernels == STRICT_CHAIN_KERNELS and seen == [1] and backend.info.max_verify_rows == 16
    finally:
        backend.close()
