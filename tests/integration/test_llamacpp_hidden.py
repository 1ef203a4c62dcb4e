"""Hidden states on the llama.cpp backend (the `HiddenStates` capability draft heads read),
on the embedded SmolLM2-135M GGUF.

Reference for the frontier: a fresh `extend` of the same tokens (memory cleared), whose last
row is the frontier's position.  Tolerance, measured on this model: a verify row's final-norm
state differs from the fresh extend's by at most 0.19 elementwise (batch-variance of
llama.cpp's kernels, as for the logits in test_llamacpp_backend.py; states reach ~±29), and
the GGUF's LM head applied to a state reproduces that row's llama.cpp logits within 0.39 (the
logits come from the q8 activation path).  Any other row of the same round (a sibling's, the
pending row instead of the accepted one) differs from the right one by 7.4 or more.

The decoders: random head sets (not trained, so drafts are rarely accepted) must still give
plain decoding's greedy output, up to the near-tie rule of llamacpp_ties.py.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.backends.base import supports_hidden  # noqa: E402
from draftwise.backends.llamacpp import LlamaCppBackend  # noqa: E402
from draftwise.runtime.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract  # noqa: E402
from draftwise.runtime.contracts import SamplingRelation, TopologyKind  # noqa: E402
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder  # noqa: E402
from draftwise.heads.arch import HeadArch, make_heads  # noqa: E402
from draftwise.heads.artifact import HeadTarget, load_heads, save_heads  # noqa: E402
from draftwise.models import resolve  # noqa: E402
from draftwise.proposers.heads import HeadsConfig, HeadsProposer  # noqa: E402
from draftwise.topology.compile import TreeLimits, compile_round  # noqa: E402
from draftwise.topology.tree_spec import parse_tree  # noqa: E402
from draftwise.verify.greedy import GreedyVerifier  # noqa: E402
from tests.integration.llamacpp_ties import assert_matches_plain  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]

HIDDEN_ATOL = 1.0  # |state - fresh extend's state|, elementwise (measured max 0.19 over 8 random commits)
HEAD_ATOL = 1.0  # |LM head(state) - llama.cpp logits| of the same row (measured max 0.39)
MAX_LEAVES = 8
NEW = 16  # REAL_PROMPTS prompts x 16 tokens: every family and shape still accepts and rejects
CONTRACT = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)


@pytest.fixture(scope="module")
def backend():
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    # one thread: on a shared 2-core box two llama.cpp threads spin at every barrier
    b = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=1, n_ctx=2048, max_tree_leaves=MAX_LEAVES)
    b.track_hidden()
    yield b
    b.close()


@pytest.fixture(scope="module")
def prompt(backend):
    return backend.chat_prompt([{"role": "user", "content": "Write a Python function that reverses a list."}])


@pytest.fixture(scope="module")
def greedy(backend, prompt):
    """The first 4 greedy tokens after the prompt (plain decoding)."""
    backend.reset()
    out = [int(np.argmax(backend.extend(prompt).logits[0]))]
    for _ in range(3):
        logits = backend.verify(out[-1], None).logits
        backend.commit([])
        out.append(int(np.argmax(logits[0])))
    return out


def make_round(prefix_len: int, nodes: list[tuple[int, int]]):
    """nodes: (token, parent node index or -1), parents first."""
    depth: list[int] = []
    props = []
    for token, parent in nodes:
        depth.append(1 if parent == -1 else depth[parent] + 1)
        props.append(ProposalNode(token=token, parent=parent, depth=depth[-1]))
    return compile_round(prefix_len, [ProposalResult(tuple(props), CONTRACT, "test", "h")],
                         TreeLimits(max_nodes=64, max_depth=16))


def fresh_hidden(backend: LlamaCppBackend, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(state [d], logits [V]) of the last of `tokens`, read by a fresh extend."""
    backend.reset()
    logits = backend.extend(tokens).logits[0].copy()
    h = backend.frontier_hidden()
    assert h is not None and h.shape == (backend.batch.weights.n_embd,) and h.dtype == np.float32
    return h.copy(), logits


def check_frontier(backend: LlamaCppBackend, tokens: list[int], h: np.ndarray | None, logits: np.ndarray) -> None:
    """h is the state of the last of `tokens` (its verify row gave `logits`)."""
    assert h is not None
    lm_head = backend.token_weights().lm_head  # [V, d]
    head_logits = lm_head @ h  # [V]
    assert np.max(np.abs(head_logits - logits)) < HEAD_ATOL
    assert int(np.argmax(head_logits)) == int(np.argmax(logits))
    want, want_logits = fresh_hidden(backend, tokens)
    diff = float(np.max(np.abs(h - want)))
    assert diff < HIDDEN_ATOL, f"frontier differs from a fresh extend's state by {diff:.3g}"
    assert int(np.argmax(lm_head @ want)) == int(np.argmax(want_logits))


def test_supports_hidden(backend):
    assert supports_hidden(backend)


def test_extend_sets_the_frontier_and_truncate_and_reset_clear_it(backend, prompt):
    backend.reset()
    assert backend.frontier_hidden() is None
    backend.extend(prompt[:-1])
    h = backend.frontier_hidden()
    check_frontier(backend, prompt[:-1], h, fresh_hidden(backend, prompt[:-1])[1])
    backend.extend(prompt[-1:])  # one token: decoded alone with embeddings on
    assert backend.frontier_hidden() is not None
    backend.truncate(backend.cached_len)  # nothing dropped: the frontier stays
    assert backend.frontier_hidden() is not None
    backend.truncate(backend.cached_len - 1)
    assert backend.frontier_hidden() is None
    backend.extend(prompt[-1:])
    backend.reset()
    assert backend.frontier_hidden() is None


def test_pending_only_commit_keeps_the_pending_row(backend, prompt):
    backend.reset()
    logits = backend.verify(prompt[-1], None, unread=prompt[:-1]).logits[0].copy()
    assert backend.frontier_hidden() is None  # the prompt's rows carry no state
    backend.commit([])
    check_frontier(backend, prompt, backend.frontier_hidden(), logits)


def test_chain_commit_keeps_the_last_accepted_row(backend, prompt, greedy):
    backend.reset()
    backend.extend(prompt[:-1])
    t = backend.cached_len
    round_ = make_round(t + 1, [(greedy[0], -1), (greedy[1], 0), (greedy[2], 1), (7, 2)])
    logits = backend.verify(prompt[-1], round_).logits.copy()  # [1+N, V]
    backend.commit([0, 1])
    assert backend.cached_len == t + 3
    check_frontier(backend, prompt + greedy[:2], backend.frontier_hidden(), logits[2])


def test_tree_commit_off_the_row_order_keeps_the_accepted_row(backend, prompt, greedy):
    backend.reset()
    backend.extend(prompt[:-1])
    t = backend.cached_len
    # rows: 0 = a wrong first token, 1 = greedy[0], 2 = a child of the wrong one, 3 = greedy[1] under row 1
    round_ = make_round(t + 1, [(11, -1), (greedy[0], -1), (greedy[1], 0), (greedy[1], 1), (13, 1)])
    logits = backend.verify(prompt[-1], round_).logits.copy()
    backend.commit([1, 3])
    check_frontier(backend, prompt + greedy[:2], backend.frontier_hidden(), logits[4])


def test_verify_more_rows_carry_their_states(backend, prompt, greedy):
    backend.reset()
    backend.extend(prompt[:-1])
    t = backend.cached_len
    first = [(greedy[0], -1), (17, -1)]
    grown = first + [(greedy[1], 0), (19, 1), (greedy[2], 2)]
    backend.verify(prompt[-1], make_round(t + 1, first))
    more = backend.verify_more(make_round(t + 1, grown), len(first)).logits.copy()  # rows 2, 3, 4
    backend.commit([0, 2, 4])
    check_frontier(backend, prompt + greedy[:3], backend.frontier_hidden(), more[2])


def test_rollback_keeps_the_committed_frontier(backend, prompt, greedy):
    backend.reset()
    backend.verify(prompt[-1], None, unread=prompt[:-1])
    backend.commit([])
    h = backend.frontier_hidden().copy()
    backend.verify(greedy[0], make_round(backend.cached_len + 1, [(greedy[1], -1), (23, -1)]))
    backend.rollback()
    assert np.array_equal(backend.frontier_hidden(), h)


def test_batch_slots_keep_hidden_states_of_their_own(backend, prompt, greedy):
    """On a batch, a tracking slot's round and another slot's prompt share one decode (embeddings
    on: llama.cpp then outputs every row): each slot reads its own rows, and only the tracking
    slot gets a frontier."""
    from draftwise.backends.batch import VerifyCall, keeps_hidden
    from draftwise.backends.llamacpp import LlamaCppBatch

    batch = LlamaCppBatch.from_backend(backend, max_slots=2, max_tree_leaves=2, slot_ctx=512)
    try:
        assert keeps_hidden(batch)
        tracked, other = batch.open(), batch.open()
        batch.track_hidden(tracked)
        round_ = make_round(len(prompt), [(greedy[0], -1), (greedy[1], 0), (11, -1)])
        text = prompt[:12] + [777]
        got = batch.verify_many([VerifyCall(tracked, prompt[-1], round_, tuple(prompt[:-1])),
                                 VerifyCall(other, text[-1], None, tuple(text[:-1]))])
        mine, theirs = np.array(got[0].logits), np.array(got[1].logits)
        assert mine.shape == (4, backend.info.vocab_size) and theirs.shape == (1, backend.info.vocab_size)
        batch.commit(tracked, [0, 1])
        batch.commit(other, [])
        assert batch.frontier_hidden(other) is None
        check_frontier(backend, prompt + greedy[:2], batch.frontier_hidden(tracked), mine[2])
        want = fresh_hidden(backend, text)[1]
        assert np.max(np.abs(theirs[0] - want)) < HEAD_ATOL + 0.5  # batch rounding, far below a wrong row's move
    finally:
        batch.free()


def test_token_weights_match_the_transformers_backend(backend, smol_target):
    ours, theirs = backend.token_weights(), smol_target.token_weights()
    assert backend.token_weights() is ours  # read once, cached
    for mine, other in ((ours.embed, theirs.embed), (ours.lm_head, theirs.lm_head)):
        assert mine.dtype == np.float32 and mine.shape == other.shape == (backend.info.vocab_size, backend.batch.weights.n_embd)
        np.testing.assert_allclose(mine, other, rtol=0, atol=1e-6)  # a conversion, elementwise: no sum to reorder


# ---- decoders --------------------------------------------------------------------------------

def random_heads(directory, family: str, target: LlamaCppBackend, seed: int):
    """An untrained head set with small random weights (zero-initialised layers would make every
    head repeat the LM head of the frontier state), on a draft vocabulary of the first 8192 ids."""
    arch = HeadArch(family=family, num_heads=3, hidden_size=target.batch.weights.n_embd, layers=1,
                    vocab_size=target.info.vocab_size, draft_vocab=8192)
    heads = make_heads(arch)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in heads.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    save_heads(directory, arch, heads, torch.arange(8192), HeadTarget(target.info.checkpoint, target.info.tokenizer_hash),
               {"family": family, "recipe": "random (test)"})
    return load_heads(directory)


@pytest.fixture(scope="module")
def prompts_and_plain(backend, spec_bench_prompts):
    prompts = [backend.chat_prompt([{"role": "user", "content": t}]) for t in spec_bench_prompts[:3]]
    config = GenerationConfig(max_new_tokens=NEW)
    return prompts, [SpeculativeDecoder(backend, [], GreedyVerifier(), config).generate(p).tokens for p in prompts]


@pytest.mark.parametrize("family,tree", [
    ("hydra", None),  # a chain through the heads
    ("hydra", "cartesian:2,2"),
    ("medusa", json.dumps([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])),
])
def test_heads_decoder_identical_to_plain(backend, prompts_and_plain, tmp_path, family, tree):
    headset = random_heads(tmp_path / "heads", family, backend, seed=1)
    config = HeadsConfig(tree=None if tree is None else parse_tree(tree))
    proposer = HeadsProposer(family, backend, headset, config)
    prompts, plain = prompts_and_plain
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(backend, [proposer], GreedyVerifier(), GenerationConfig(max_new_tokens=NEW)).generate(prompt)
        assert_matches_plain(backend, prompt, result.tokens, reference)
        first, *rest = result.records
        assert first.nodes == 0  # nothing read yet: no state, no proposal
        # every later round had the frontier state of the round before: the heads proposed
        assert all(r.nodes > 0 for r in rest if r.asked and r.depth_limit >= 1)


@pytest.fixture(scope="module")
def real_prompts_and_plain(backend, spec_bench_prompts):
    prompts = [backend.chat_prompt([{"role": "user", "content": t}]) for t in spec_bench_prompts]
    config = GenerationConfig(max_new_tokens=NEW)
    return prompts, [SpeculativeDecoder(backend, [], GreedyVerifier(), config).generate(p).tokens for p in prompts]


# each family once, chains and trees both covered (the suite's largest cases; every
# family's chain and tree are also token-identical on transformers, test_heads_smollm.py)
@pytest.mark.parametrize("family,tree", [("hydra", None), ("medusa", "wbd:2,1"), ("hydra++", None), ("clover", "wbd:2,1")])
def test_shipped_heads_on_llamacpp_match_plain_on_spec_bench_prompts(backend, real_prompts_and_plain, family, tree):
    """The committed heads of the embedded model, read from llama.cpp's embeddings: greedy output
    equals plain decoding (up to llama.cpp's batch-shape near-ties) and drafts are accepted."""
    from draftwise.heads.defaults import default_heads

    headset = load_heads(default_heads(family, backend.info.checkpoint))
    proposer = HeadsProposer(family, backend, headset, HeadsConfig(tree=None if tree is None else parse_tree(tree)))
    prompts, plain = real_prompts_and_plain
    accepted = 0
    for prompt, reference in zip(prompts, plain):
        result = SpeculativeDecoder(backend, [proposer], GreedyVerifier(), GenerationConfig(max_new_tokens=NEW)).generate(prompt)
        assert_matches_plain(backend, prompt, result.tokens, reference)
        accepted += sum(r.accepted for r in result.records)
    assert accepted > 0  # trained heads: some drafts of the prompts were right


def test_heads_draft_for_a_llamacpp_batch_and_part_from_plain_only_at_near_ties(backend):
    """llama.cpp batch slots keep their own hidden states, so the shipped heads run in a batch:
    alone, a request's greedy answer is plain decoding's; in a batch (a tree's leaves share one
    unified cache, whose rows may round differently) it parts from it only at near-ties, and the
    heads' drafts are accepted somewhere."""
    import draftwise
    from draftwise.spec import DecoderSpec
    from tests.integration.test_batch_engine import assert_parts_only_at_near_ties, llamacpp_prompts

    prompts = llamacpp_prompts(backend)
    spec = DecoderSpec(backend="llamacpp", threads=backend.n_threads, generation=GenerationConfig(max_new_tokens=16))
    decoder = draftwise.open_decoder(spec, proposer="hydra", loader=lambda *_: backend)
    plain = [decoder.plain().generate(p).tokens for p in prompts]
    assert [decoder.generate(p).tokens for p in prompts] == plain
    shared = decoder.generate_many(prompts, max_batch=3)
    assert all(not isinstance(r, BaseException) for r in shared), shared
    assert sum(sum(r.from_draft) for r in shared) > 0
    assert_parts_only_at_near_ties(backend, decoder.spec, prompts, shared)
