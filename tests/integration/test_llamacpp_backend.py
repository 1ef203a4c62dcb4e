"""llama.cpp backend on the embedded SmolLM2-135M GGUF: tree verify and KV publication.

Reference for every check: a fresh prefill (memory cleared, tokens evaluated in order in
sequence 0), i.e. plain sequential decoding of the same tokens.

Tolerance, measured on this model (Q4_1 weights, f16 KV, CPU kernels):
- llama.cpp rows are NOT bitwise independent of how they were batched.  A one-token batch
  takes other kernels than a multi-row one, and a committed path whose cells are scattered
  (accepted rows that are not a prefix of the row order leave holes that later tokens fill)
  sums attention in another cell order.  Either makes 1-ulp differences that the q8
  activation quantization amplifies: plain one-token decoding of 80 tokens vs one prefill
  gives max |dlogit| 0.76 (KL 6e-3); one tree round with scattered accepted cells gives 0
  or 0.46-0.74.  Contiguous layouts (chain rounds, row-order-prefix acceptance) reproduce
  the prefill bit for bit.
- A real publication bug is far larger: a committed path missing one accepted token moves
  the next logits by 3.1-8.9 (15 random trees).
So ATOL = 1.5 sits twice above the noise and twice below the smallest bug; the argmax must
agree wherever the reference's top-1 margin exceeds the noise (2 * ATOL), since a closer
pair may legitimately swap under that noise.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install draftwise[llamacpp])")

from draftwise.backends.base import BackendError  # noqa: E402
from draftwise.backends.llamacpp import LlamaCppBackend  # noqa: E402
from draftwise.runtime.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract  # noqa: E402
from draftwise.runtime.contracts import SamplingRelation, TopologyKind  # noqa: E402
from draftwise.models import resolve  # noqa: E402
from draftwise.topology.compile import TreeLimits, compile_round  # noqa: E402
from tests.helpers import path_to  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]

ATOL = 1.5
MAX_LEAVES = 8
CONTRACT = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)


@pytest.fixture(scope="module")
def backend():
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    # one thread: on a shared 2-core box, two llama.cpp threads spin at every barrier while the
    # other is descheduled (this module took 130 s with 2 threads under load, 23 s with 1)
    b = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=1, n_ctx=2048, max_tree_leaves=MAX_LEAVES)
    yield b
    b.close()


@pytest.fixture(scope="module")
def prompt(backend):
    return backend.chat_prompt([{"role": "user", "content": "Write a Python function that reverses a list."}])


def make_round(prefix_len: int, nodes: list[tuple[int, int]]):
    """nodes: (token, parent node index or -1), parents first."""
    depth: list[int] = []
    props = []
    for token, parent in nodes:
        depth.append(1 if parent == -1 else depth[parent] + 1)
        props.append(ProposalNode(token=token, parent=parent, depth=depth[-1]))
    result = ProposalResult(tuple(props), CONTRACT, "test", "h")
    return compile_round(prefix_len, [result], TreeLimits(max_nodes=64, max_depth=16))


def random_nodes(rng, n: int, max_depth: int, max_leaves: int, start=()) -> list[tuple[int, int]]:
    """A random tree of n nodes (parents first) with at most max_depth levels and max_leaves
    leaves; the first nodes are `start` (a tree grown from it)."""
    nodes: list[tuple[int, int]] = []
    depth: list[int] = []
    n_children: list[int] = []
    for token, parent in start:
        nodes.append((token, parent))
        depth.append(1 if parent == -1 else depth[parent] + 1)
        n_children.append(0)
        if parent != -1:
            n_children[parent] += 1
    while len(nodes) < n:
        parent = int(rng.integers(-1, len(nodes)))
        d = 1 if parent == -1 else depth[parent] + 1
        leaves = sum(c == 0 for c in n_children) + 1 - (parent != -1 and n_children[parent] == 0)
        if d > max_depth or leaves > max_leaves:
            continue
        nodes.append((int(rng.integers(100, 40000)), parent))
        depth.append(d)
        n_children.append(0)
        if parent != -1:
            n_children[parent] += 1
    return nodes


def fresh_logits(backend: LlamaCppBackend, tokens: list[int]) -> np.ndarray:
    backend.reset()
    return backend.extend(tokens).logits[0].copy()  # [V]


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    diff = float(np.max(np.abs(got - want)))
    assert diff < ATOL, f"{what}: max |diff| {diff:.3g} >= {ATOL}"
    top2 = np.sort(want)[-2:]  # [2] second, first
    if top2[1] - top2[0] > 2 * ATOL:
        assert int(np.argmax(got)) == int(np.argmax(want)), f"{what}: argmax differs"


def test_tree_verify_matches_sequential(backend, prompt):
    backend.reset()
    backend.extend(prompt[:-1])
    pending = prompt[-1]
    t = backend.cached_len
    rng = np.random.default_rng(0)
    tok = lambda: int(rng.integers(100, 40000))  # noqa: E731
    # depth 3 with siblings at every level: a b c | a->d e, b->f | d->g h, f->i, e->j
    nodes = [(tok(), -1), (tok(), -1), (tok(), -1), (tok(), 0), (tok(), 0), (tok(), 1),
             (tok(), 3), (tok(), 3), (tok(), 5), (tok(), 4)]
    round_ = make_round(t + 1, nodes)
    got = backend.verify(pending, round_).logits.copy()  # [1+N, V]
    assert got.shape == (1 + round_.n, backend.info.vocab_size)
    backend.rollback()
    assert_close(got[0], fresh_logits(backend, prompt), "pending row")
    for r in range(round_.n):
        path = list(prompt) + list(round_.path_tokens(r))
        assert_close(got[r + 1], fresh_logits(backend, path), f"row {r}")


def _assert_only_sequence_zero(backend: LlamaCppBackend) -> None:
    mem = backend.batch._mem
    main, *leaves = backend.batch.seq_ids(backend.slot)
    assert main == 0 and len(leaves) == MAX_LEAVES
    assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == (0 if backend.cached_len else -1)
    assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == backend.cached_len - 1
    for s in leaves:
        assert llama_cpp.llama_memory_seq_pos_max(mem, s) == -1, f"sequence {s} still holds cells"
    assert backend.kv_bytes() == backend.cached_len * backend.geometry.bytes_per_cell


def test_commit_after_many_random_rounds_matches_fresh_prefill(backend, prompt):
    rng = np.random.default_rng(1)
    backend.reset()
    backend.extend(prompt[:-1])
    committed = list(prompt[:-1])
    pending = prompt[-1]
    kinds = {"non_leaf": 0, "leaf": 0, "none": 0, "non_prefix": 0}
    for i in range(60):
        t = backend.cached_len
        if i % 10 == 9:  # plain decoding and chains take the sequence-0 fast path
            round_ = None if i % 20 == 9 else make_round(t + 1, [(int(rng.integers(100, 40000)), j - 1) for j in range(3)])
        else:
            round_ = make_round(t + 1, random_nodes(rng, int(rng.integers(2, 13)), 4, MAX_LEAVES))
        logits = backend.verify(pending, round_)
        accepted: list[int] = []
        if round_ is not None:
            accepted = path_to(round_, int(rng.integers(-1, round_.n)))  # to a random row; -1 = none accepted
            if accepted:
                kinds["leaf" if not round_.children_of(accepted[-1]) else "non_leaf"] += 1
                kinds["non_prefix"] += accepted != list(range(len(accepted)))
            else:
                kinds["none"] += 1
        bonus_row = accepted[-1] + 1 if accepted else 0  # logits row after the last accepted token
        pending = _commit(backend, round_, accepted, committed, pending, int(logits.argmax()[bonus_row]))
    assert all(v > 0 for v in kinds.values()), kinds
    _assert_next_logits_match_prefill(backend, committed, pending, "next-token logits after 60 rounds")


def _commit(backend, round_, accepted, committed, pending, bonus):
    """Commit `accepted`, extend `committed` in place, check sequence 0 alone holds it; return the new pending token."""
    backend.commit(accepted)
    committed += [pending] + [int(round_.token_ids[r]) for r in accepted]
    assert backend.cached_len == len(committed)
    _assert_only_sequence_zero(backend)
    return bonus


def _assert_next_logits_match_prefill(backend, committed, pending, what):
    probe = backend.verify(pending, None).logits[0].copy()
    backend.rollback()
    assert_close(probe, fresh_logits(backend, committed + [pending]), what)


def test_rejected_and_sibling_rows_are_never_published(backend, prompt):
    backend.reset()
    backend.extend(prompt[:-1])
    t = backend.cached_len
    # siblings 0/1 share a parent; 2 is a deep rejected branch under 1; accept 0 -> 3 (non-leaf 3)
    nodes = [(1000, -1), (2000, -1), (3000, 1), (4000, 0), (5000, 3), (6000, 3)]
    round_ = make_round(t + 1, nodes)
    backend.verify(prompt[-1], round_)
    backend.commit([0, 3])
    committed = list(prompt) + [1000, 4000]
    assert backend.cached_len == len(committed)
    _assert_only_sequence_zero(backend)
    probe_round = make_round(backend.cached_len + 1, [(7000, -1), (8000, 0)])  # a probe chain
    got = backend.verify(777, probe_round).logits.copy()
    backend.rollback()
    assert_close(got[2], fresh_logits(backend, committed + [777, 7000, 8000]), "probe after commit")


def test_round_over_leaf_budget_is_refused_and_state_stays_usable(backend, prompt):
    backend.reset()
    backend.extend(prompt[:-1])
    t = backend.cached_len
    wide = make_round(t + 1, [(100 + i, -1) for i in range(MAX_LEAVES + 1)])
    with pytest.raises(BackendError, match="leaves"):
        backend.verify(prompt[-1], wide)
    assert backend.cached_len == t
    _assert_only_sequence_zero(backend)
    got = backend.verify(prompt[-1], None).logits[0].copy()
    backend.commit([])
    assert_close(got, fresh_logits(backend, prompt), "after refusal")


def test_extend_truncate_round_trip(backend, prompt):
    backend.reset()
    first = backend.extend(prompt).logits[0].copy()
    backend.extend([1000, 2000, 3000])
    assert backend.cached_len == len(prompt) + 3
    backend.truncate(len(prompt) - 1)
    _assert_only_sequence_zero(backend)
    again = backend.extend(prompt[-1:]).logits[0]
    assert_close(again, first, "extend after truncate")
    backend.verify(5, make_round(backend.cached_len + 1, [(10, -1), (11, -1)]))
    backend.truncate(4)  # drops the provisional round too
    assert backend.cached_len == 4
    _assert_only_sequence_zero(backend)


def test_text_and_info(backend, prompt):
    assert backend.info.name == "llamacpp" and backend.info.vocab_size == 49152
    assert backend.detokenize(backend.tokenize("def f(x):\n    return x", add_special=False)) == "def f(x):\n    return x"
    text = backend.detokenize(prompt)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert backend.info.eos_token_ids
    assert backend.info.kv_row_bytes == backend.geometry.bytes_per_cell > 0


def test_first_round_reads_the_prompt_as_unread_rows(backend, prompt):
    """Round 1 passes the prompt as `unread`: the rows match a fresh prefill of their paths, the
    prompt rows are committed at once, and a commit of a non-first branch publishes it alone."""
    backend.reset()
    nodes = [(1000, -1), (2000, -1), (3000, 1), (4000, 2)]  # a | b -> c -> d
    round_ = make_round(len(prompt), nodes)
    got = backend.verify(prompt[-1], round_, unread=prompt[:-1]).logits.copy()  # [1+N, V]
    assert got.shape == (1 + round_.n, backend.info.vocab_size)
    assert backend.cached_len == len(prompt) - 1
    backend.commit([1, 2])  # b -> c: not a prefix of the row order
    committed = list(prompt) + [2000, 3000]
    assert backend.cached_len == len(committed)
    _assert_only_sequence_zero(backend)
    probe = backend.verify(777, None).logits[0].copy()
    backend.rollback()
    assert_close(probe, fresh_logits(backend, committed + [777]), "probe after the first round")
    assert_close(got[0], fresh_logits(backend, list(prompt)), "pending row")
    for r in range(round_.n):
        assert_close(got[r + 1], fresh_logits(backend, list(prompt) + list(round_.path_tokens(r))), f"row {r}")


def test_a_chain_only_context_profiles_chains_and_grows_its_sequences_for_trees():
    from draftwise.measure.profile import profile_verify_cost

    chain_only = LlamaCppBackend.load(resolve("smollm2-135m"), n_threads=1, n_ctx=512, max_tree_leaves=0)
    measured = profile_verify_cost(chain_only, prefix_len=32, rows=(1, 3, 6), repeats=1, chain=True)
    assert measured["rows"] == [1, 3, 6] and all(s > 0 for s in measured["absolute_s"])
    assert chain_only.max_tree_leaves == 0  # chains need no tree sequences: the context stays as it was
    with pytest.raises(BackendError, match="leaves"):  # a tree round before any reserve is refused, not corrupted
        chain_only.reset()
        chain_only.extend([1, 2, 3])
        chain_only.verify(4, make_round(4, [(1000, -1), (2000, -1)]))
    chain_only.rollback()
    measured = profile_verify_cost(chain_only, prefix_len=32, rows=(1, 3, 6), repeats=1)  # random trees
    assert chain_only.max_tree_leaves == 5 and all(s > 0 for s in measured["absolute_s"])
    chain_only.close()


def _grow(backend: LlamaCppBackend, pending: int, nodes: list[tuple[int, int]], cuts: list[int]):
    """Verify nodes[:cuts[0]] (None when 0), then verify_more up to each later cut; return the
    final round and logits [1+N, V] assembled from the calls (pending row first)."""
    t = backend.cached_len
    first = make_round(t + 1, nodes[: cuts[0]]) if cuts[0] else None
    parts = [backend.verify(pending, first).logits.copy()]
    for start, stop in zip(cuts, cuts[1:]):
        grown = make_round(t + 1, nodes[:stop])
        parts.append(backend.verify_more(grown, start).logits.copy())  # [stop - start, V]
        assert parts[-1].shape[0] == stop - start
    return make_round(t + 1, nodes[: cuts[-1]]), np.concatenate(parts)


def test_grown_rounds_match_sequential_decoding(backend, prompt):
    """A round grown by verify_more from a plain verify, a chain and a tree (new rows under
    leaves, under inner rows and at the frontier) gives every row its own path's logits."""
    rng = np.random.default_rng(3)
    tok = lambda: int(rng.integers(100, 40000))  # noqa: E731
    chain_then_branches = [(tok(), -1), (tok(), 0), (tok(), 1), (tok(), 2), (tok(), 0), (tok(), 4), (tok(), 3)]
    tree_then_levels = [(tok(), -1), (tok(), -1), (tok(), 0), (tok(), 0), (tok(), 1),  # level 1-2
                        (tok(), 2), (tok(), 3), (tok(), 3), (tok(), 0), (tok(), -1), (tok(), 6)]
    for nodes, cuts in [(chain_then_branches, [0, 4, 7]), (chain_then_branches, [4, 6, 7]),
                        (tree_then_levels, [5, 9, 11]), (tree_then_levels, [2, 5, 11])]:
        backend.reset()
        backend.extend(prompt[:-1])
        round_, got = _grow(backend, prompt[-1], nodes, cuts)
        assert got.shape == (1 + round_.n, backend.info.vocab_size)
        assert backend.kv_bytes() == (len(prompt) + round_.n) * backend.geometry.bytes_per_cell
        backend.rollback()
        _assert_only_sequence_zero(backend)
        assert_close(got[0], fresh_logits(backend, list(prompt)), f"pending row, cuts {cuts}")
        for r in range(round_.n):
            assert_close(got[r + 1], fresh_logits(backend, list(prompt) + list(round_.path_tokens(r))),
                         f"row {r}, cuts {cuts}")


def test_commit_after_grown_rounds_matches_fresh_prefill(backend, prompt):
    rng = np.random.default_rng(4)
    backend.reset()
    backend.extend(prompt[:-1])
    committed, pending = list(prompt[:-1]), prompt[-1]
    through_new = 0
    for i in range(30):
        n = int(rng.integers(3, 11))
        first = int(rng.integers(0, n))  # rows of the first verify (0: pending only)
        if first and i % 3 == 0:  # a chain first: sequence 0 holds it, branches grow from it
            start = [(int(rng.integers(100, 40000)), j - 1) for j in range(first)]
        else:
            start = random_nodes(rng, first, 4, MAX_LEAVES // 2)
        nodes = random_nodes(rng, n, 5, MAX_LEAVES // 2, start=start)
        cuts = sorted({first, int(rng.integers(first, n)) + 1, n})  # one or two verify_more calls
        round_, logits = _grow(backend, pending, nodes, cuts)
        accepted = path_to(round_, int(rng.integers(-1, round_.n)))  # to a random row; -1 = none accepted
        through_new += bool(accepted) and accepted[-1] >= cuts[0]
        bonus = int(np.argmax(logits[accepted[-1] + 1 if accepted else 0]))
        pending = _commit(backend, round_, accepted, committed, pending, bonus)
    assert through_new >= 5
    _assert_next_logits_match_prefill(backend, committed, pending, "next-token logits after 30 grown rounds")


def test_verify_more_refuses_what_does_not_extend_the_round(backend, prompt):
    backend.reset()
    backend.extend(prompt[:-1])
    t = backend.cached_len
    base = [(1000, -1), (2000, -1)]
    with pytest.raises(BackendError, match="without a provisional verify"):
        backend.verify_more(make_round(t + 1, base + [(3000, 0)]), 2)
    backend.verify(prompt[-1], make_round(t + 1, base))
    with pytest.raises(BackendError, match="2 candidate rows are provisional"):
        backend.verify_more(make_round(t + 1, base + [(3000, 0)]), 1)
    with pytest.raises(BackendError, match="begin with the provisional rows"):
        backend.verify_more(make_round(t + 1, [(1000, -1), (2500, -1), (3000, 0)]), 2)
    with pytest.raises(BackendError, match="no new rows"):
        backend.verify_more(make_round(t + 1, base), 2)
    wide = base + [(3000 + i, 0) for i in range(MAX_LEAVES)]  # 1 + 8 leaves > 8 sequences
    with pytest.raises(BackendError, match="reserve a larger tree budget"):
        backend.verify_more(make_round(t + 1, wide), 2)
    # every refusal left the provisional round as it was: it still grows and commits
    grown = make_round(t + 1, base + [(3000, 1)])
    got = backend.verify_more(grown, 2).logits[0].copy()
    backend.commit([1, 2])
    _assert_only_sequence_zero(backend)
    assert_close(got, fresh_logits(backend, list(prompt) + [2000, 3000]), "grown row after refusals")


CHATS = [
    [{"role": "user", "content": "Write a Python function that reverses a list."}],
    [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Bonjour, ça va ? 🙂"}],
    [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "  And {{ braces }} and <|im_end|> spelled out?\n\n"}],
]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_prompt_matches_transformers_apply_chat_template(backend, smol_target, messages):
    """llama.cpp renders the GGUF's template with llama-cpp-python's Jinja2ChatFormatter; the ids
    must be transformers' apply_chat_template ids (the transformers backend's chat_prompt)."""
    assert backend.chat_prompt(messages) == smol_target.chat_prompt(messages)


def test_render_chat_has_transformers_jinja_semantics():
    """Loop controls and transformers' tojson (no HTML escaping, no key sorting) in a template."""
    from draftwise.backends.llamacpp_text import render_chat

    template = ("{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                "{{ m | tojson }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    messages = [{"role": "user", "content": "<a> & é"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert render_chat(template, messages, "<s>", "</s>") == (
        '<s>{"role": "user", "content": "<a> & é"}\n{"role": "assistant", "content": "b"}\n>'
    )
