"""A separate draft model (same tokenizer, checked by hash) proposing a chain or a tree.

The draft runs on its own backend and keeps its KV cache in step with the committed prefix:
at each proposal it truncates to the longest prefix it shares with the committed tokens (so
rejected drafts are rolled back) and extends with what it has not seen.

Chain mode draws k tokens one incremental step at a time and may stop early when the draft's
own confidence drops below a threshold (transformers' `assistant_confidence_threshold`); the
stop depends on draft quantities only, so exactness is untouched.  Tree mode expands a
template level by level, one draft pass per level (level 1 comes from the same extend that
feeds the unseen tokens; level 2 verifies level 1's rows, and each deeper pass adds only the
previous level's rows to the provisional tree, so every node is evaluated once), with children drawn
i.i.d., without replacement, or as deterministic top-k; the declared sampling relation is
the one really used.  Every expanded parent records the whole distribution its children were
drawn from, so residual verifiers get vectors, not scalars.

Every draft forward is a step of `drafting` (`proposers.base.SteppedProposer`): alone, the step is
answered at once on the draft backend; in a batch, each request drafts on a slot of one batched
draft model (`backends.batch.DraftSlot`), and the batch answers the step of every request in ONE
forward of that model (`DraftBatch.draft_many`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generator, Sequence

import numpy as np

from draftwise.backends.base import Backend
from draftwise.backends.batch import DraftCall, DraftSlot, Extend, GrowRound, VerifyCall, draft_alone
from draftwise.runtime.contracts import (
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)
from draftwise.errors import ContractError
from draftwise.errors import InputError
from draftwise.options import option
from draftwise.runtime.logits import TargetLogits
from draftwise.proposers.base import DraftRequest, Drafter, RoundFeedback, propose_alone
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterResources
from draftwise.runtime.sampling import SamplingPolicy, sample
from draftwise.topology.compile import TreeLimits, compile_round
from draftwise.topology.tree_spec import TreeSpec, TreeTemplate, parse_tree, resolved_template, show_tree
from draftwise.topology.templates import Template, cartesian, max_depth, max_depth as max_depth_of, num_children, slots_by_parent
from draftwise.verify.sequoia import without_replacement_q

RAW = SamplingPolicy(temperature=1.0)  # the draft's own softmax, for its confidence


class TokenizerMismatch(ContractError):
    """Target and draft do not share a tokenizer."""


@dataclass(frozen=True)
class DraftConfig:
    k: int = option(8, help="chain length (chain mode)")
    # transformers' assistant_confidence_threshold
    confidence_threshold: float = option(0.4, key="confidence",
                                         help="stop the chain after a token the draft gave less than this; 0 disables")
    tree: TreeSpec | None = option(None, parse=parse_tree, show=show_tree,
                                   help="tree mode: chain:4, wbd:2,2,1, cartesian:3,2,2, JSON paths, a `tree optimize` "
                                        "directory, or auto")
    relation: SamplingRelation = option(SamplingRelation.IID, help="how tree children are drawn: iid | "
                                                                   "without_replacement | beam (top-k)")

    def __post_init__(self) -> None:
        if self.k < 1:
            raise InputError(f"draft length k must be >= 1, got {self.k}")
        if not 0.0 <= self.confidence_threshold < 1.0:
            raise InputError(f"confidence threshold must be in [0, 1), got {self.confidence_threshold}")
        allowed = {SamplingRelation.IID, SamplingRelation.WITHOUT_REPLACEMENT, SamplingRelation.BEAM}
        if self.relation not in allowed:
            raise InputError(f"tree children can be drawn {sorted(r.value for r in allowed)}, not {self.relation.value}")

    @property
    def template(self) -> Template | None:
        """The paths drawn from; an artifact or `auto` must have been resolved first."""
        return resolved_template(self.tree)


def draft_contract(template: Template | None, relation: SamplingRelation) -> ProposerContract:
    """A chain is an i.i.d. sequence; a depth-1 template is a one-position set; else a tree."""
    if template is None:
        return ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, SamplingRelation.IID, TopologyKind.SEQUENCE)
    topology = TopologyKind.SET if max_depth(template) == 1 else TopologyKind.TREE
    return ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, relation, topology)


def config_contract(config: DraftConfig) -> ProposerContract:
    """The contract from the config alone.  An artifact or `auto` tree is a multi-level tree
    (`tree optimize` and the auto planner emit one, or fall back to plain decoding)."""
    if config.tree is None or isinstance(config.tree, TreeTemplate):
        return draft_contract(config.template, config.relation)
    return ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, config.relation, TopologyKind.TREE)


def config_shape(config: DraftConfig) -> CandidateShape:
    if config.tree is None:
        return CandidateShape(config.k, config.k, False)
    if isinstance(config.tree, TreeTemplate):
        paths = config.tree.paths
        return CandidateShape(len(paths), max_depth(paths), True)
    return CandidateShape(0, 0, True)  # chosen later, within the round's tree limits


def draft_tree_rows(template: Template | None) -> int:
    """Branching rows the draft's own context must hold to re-read a tree level by level: the
    leaves of the tree above its last level (a new leaf takes over its parent's sequence)."""
    if not template:
        return 0
    deepest = max_depth(template)
    above = {path for path in template if len(path) < deepest}
    parents = {path[:-1] for path in above}
    return sum(path not in parents for path in above)


@dataclass(frozen=True)
class DraftCacheMark:
    """A proposal's state handle: where the draft's cache stood when it proposed."""

    context_len: int  # committed tokens, the pending one included
    fed_drafts: int  # drafted tokens the proposal appended to the draft's cache after them


class DraftModelProposer:
    name = "draft-model"
    phase = "propose"

    def __init__(self, draft: Backend, target_tokenizer_hash: str, config: DraftConfig = DraftConfig()) -> None:
        if draft.info.tokenizer_hash != target_tokenizer_hash:
            raise TokenizerMismatch(
                f"draft {draft.info.checkpoint} has tokenizer {draft.info.tokenizer_hash[:12]}…, the target "
                f"{target_tokenizer_hash[:12]}…; a draft model must share the target's tokenizer"
            )
        self.draft = draft
        # a batch's draft slot drafts with every request's on the shared model; alone, on its own backend
        self._drafter: Drafter = draft.batch if isinstance(draft, DraftSlot) else _Alone(draft)
        self._slot = draft.slot if isinstance(draft, DraftSlot) else 0
        self.config = config
        self.contract = config_contract(config)
        self._cached: list[int] = []  # tokens whose KV rows the draft holds
        self._policy = SamplingPolicy()
        self._rng = np.random.default_rng(0)

    def identity(self) -> dict:
        return {
            "name": self.name,
            "checkpoint": self.draft.info.checkpoint,
            "k": self.config.k,
            "confidence_threshold": self.config.confidence_threshold,
            "template": self.config.template,
            "relation": self.contract.relation.value,
        }

    def begin(self, policy: SamplingPolicy, rng: np.random.Generator) -> None:
        self._policy, self._rng = policy, rng
        self.draft.reserve(draft_tree_rows(self.config.template))
        self.draft.reset()
        self._cached = []

    def observe(self, feedback: RoundFeedback) -> None:
        """Roll the draft's cache back to the committed text: a chain fed its drafted tokens
        into the cache, and only the accepted ones are now context."""
        mark = feedback.result.state
        if not isinstance(mark, DraftCacheMark):
            return
        keep = mark.context_len + min(len(feedback.accepted), mark.fed_drafts)
        if keep < len(self._cached):
            self.draft.truncate(keep)
            del self._cached[keep:]

    def close(self) -> None:
        """Free a batch's draft slot (its KV) when the request leaves."""
        if isinstance(self.draft, DraftSlot):
            self.draft.close()

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        return propose_alone(self.drafting(context, manifest_hash, max_depth))

    def _forward(self, call: DraftCall) -> Generator[DraftRequest, Any, TargetLogits]:
        """One draft forward: alone, on the draft backend at once (no step leaves the generator);
        on a batch's slot, yielded for the batch to answer with every request's."""
        if isinstance(self._drafter, _Alone):
            return draft_alone(self.draft, call)
        logits: TargetLogits = yield DraftRequest(self._drafter, self._drafter, call)
        return logits

    def drafting(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None,
                 ) -> Generator[DraftRequest, Any, ProposalResult]:
        # drafting costs a forward per depth: never draft what the round cannot verify (the
        # last round of a generation, a context about to overflow)
        # the draft's own context bounds the proposal too: a chain of k holds k - 1 drafted
        # tokens past the context, a tree re-reads its pending token and every level but the last
        room = self.draft.info.context_length - len(context)
        if self.config.template is None:
            k = min(self.config.k, room + 1) if max_depth is None else min(self.config.k, max_depth, room + 1)
            nodes, dists = (yield from self._chain(context, k)) if k > 0 else ([], {})
        else:
            template = self.config.template
            if max_depth is not None and max_depth < max_depth_of(template):
                template = tuple(path for path in template if len(path) <= max_depth)
            template = fit_template(template, room)
            nodes, dists = (yield from self._tree(context, template)) if template else ([], {})
        # a chain leaves its drafted tokens but the last in the draft's cache; a tree rolls its rows back itself
        mark = DraftCacheMark(len(context), max(len(nodes) - 1, 0) if self.config.template is None else 0)
        return ProposalResult(
            nodes=tuple(nodes), contract=self.contract, source=self.name, manifest_hash=manifest_hash,
            distributions=dists, state=mark,
        )

    # ---- chain: incremental extend ------------------------------------------------------------
    def _sync(self, context: Sequence[int], keep_last: bool) -> int:
        """Truncate the draft to the prefix it shares with `context`; return that length."""
        limit = len(context) - (1 if keep_last else 0)
        shared = 0
        for a, b in zip(self._cached, context[:limit]):
            if a != b:
                break
            shared += 1
        self.draft.truncate(shared)
        del self._cached[shared:]
        return shared

    def _chain(self, context: Sequence[int], k: int,
               ) -> Generator[DraftRequest, Any, tuple[list[ProposalNode], dict[int, np.ndarray]]]:
        shared = self._sync(context, keep_last=True)
        feed = list(context[shared:])  # >= 1 token: the pending one at least
        nodes: list[ProposalNode] = []
        dists: dict[int, np.ndarray] = {}
        for depth in range(1, k + 1):
            logits = yield from self._forward(Extend(self._slot, tuple(feed)))
            self._cached.extend(feed)
            q = logits.probs(0, self._policy)  # [V]
            token = int(q.argmax()) if self._policy.greedy else sample(q, self._rng)
            dists[depth - 2] = q  # parent of the depth-d node is node d - 2 (-1 = frontier)
            nodes.append(ProposalNode(token=token, parent=depth - 2, depth=depth, q=float(q[token]), source=self.name))
            feed = [token]
            # transformers' ConfidenceCriteria: keep the token just drafted, stop after it when the
            # draft's own probability for it is below the threshold
            if self.config.confidence_threshold and logits.probs(0, RAW)[token] < self.config.confidence_threshold:
                break
        return nodes, dists

    # ---- tree: one draft pass per level -------------------------------------------------------
    def _tree(self, context: Sequence[int], template: Template,
              ) -> Generator[DraftRequest, Any, tuple[list[ProposalNode], dict[int, np.ndarray]]]:
        # level 1 needs only the pending token's logits: one extend of every unseen token (the
        # pending one included) gives them, instead of an extend plus a separate pass for it
        shared = self._sync(context, keep_last=True)
        level_one = yield from self._forward(Extend(self._slot, tuple(int(t) for t in context[shared:])))
        self._cached.extend(context[shared:])
        try:
            return (yield from self._expand(context, template, level_one))
        finally:
            self.draft.rollback()  # the tree's rows were provisional: the draft keeps the context only

    def _expand(self, context: Sequence[int], template: Template, level_one: TargetLogits,
                ) -> Generator[DraftRequest, Any, tuple[list[ProposalNode], dict[int, np.ndarray]]]:
        slots = slots_by_parent(template)  # template node i: (parent template node, child slot)
        widths = num_children(template)  # template node (-1 = frontier) -> children to draw
        node_of_template: dict[int, int] = {}
        nodes: list[ProposalNode] = []
        dists: dict[int, np.ndarray] = {}  # node index (-1 = frontier) -> q [V] its children were drawn from
        ranking: dict[int, np.ndarray] = {}  # node index -> its draft's top-k token ids [k], best first
        drawn: dict[int, list[int]] = {}
        round_ = None  # the tree so far, provisional in the draft: each level's pass adds only the level above
        for level in range(1, max_depth(template) + 1):
            level_nodes = [i for i, s in enumerate(slots) if _depth(slots, i) == level]
            parents = sorted({slots[i].parent for i in level_nodes})
            if level == 1:
                logits, first_row = level_one, -1  # logits row 0 = the frontier (-1)
            else:
                # the tree so far, as a plain token tree: the draft only needs its rows' logits
                partial = ProposalResult(
                    nodes=tuple(dataclasses.replace(n, q=None) for n in nodes),
                    contract=ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.IID, TopologyKind.TREE),
                    source=self.name, manifest_hash="",
                )
                # every node gets its row (the engine's limits are the target's business), rows of
                # earlier levels first, in the same order
                grown = compile_round(len(context), [partial], TreeLimits(max_nodes=len(nodes), max_depth=level))
                if round_ is None:  # level 2: the pending token becomes a verify row
                    self.draft.truncate(len(context) - 1)
                    del self._cached[len(context) - 1:]
                    logits = yield from self._forward(VerifyCall(self._slot, int(context[-1]), grown))
                    first_row = -1  # row r + 1 = candidate r
                else:  # deeper: evaluate only the previous level's rows, on top of the provisional tree
                    logits = yield from self._forward(GrowRound(self._slot, grown, round_.n))
                    first_row = round_.n  # row i = candidate first_row + i
                round_ = grown
            for parent in parents:
                parent_node = -1 if parent == -1 else node_of_template[parent]
                row = 0 if parent_node == -1 else round_.origin[0][parent_node] - first_row
                dists[parent_node] = logits.probs(row, self._policy)
                if self.config.relation is SamplingRelation.BEAM:
                    ranking[parent_node] = top_k_order(logits.probs(row, RAW), widths[parent])
            for i in level_nodes:
                parent_node = -1 if slots[i].parent == -1 else node_of_template[slots[i].parent]
                token = self._draw(dists[parent_node], ranking.get(parent_node), drawn.setdefault(parent_node, []),
                                   slots[i].slot)
                node_of_template[i] = len(nodes)
                nodes.append(ProposalNode(token=token, parent=parent_node, depth=level,
                                          q=float(dists[parent_node][token]), source=self.name))
        return nodes, dists  # appended level by level, so parents precede children

    def _draw(self, q: np.ndarray, ranking: np.ndarray | None, already: list[int], slot: int) -> int:
        relation = self.config.relation
        if relation is SamplingRelation.BEAM:
            token = int(ranking[slot])  # deterministic top-k of the draft's softmax
        elif relation is SamplingRelation.WITHOUT_REPLACEMENT:
            token = sample(without_replacement_q(q, already), self._rng)
        else:
            token = sample(q, self._rng)
        already.append(token)
        return token


class _Alone:
    """A draft model of one request: each call on its backend, at once."""

    def __init__(self, draft: Backend) -> None:
        self.draft = draft

    def draft_many(self, calls: Sequence[DraftCall]) -> list[TargetLogits]:
        return [draft_alone(self.draft, call) for call in calls]


def fit_template(template: Template, room: int) -> Template:
    """`template` without its deepest levels until the rows the draft re-reads (the pending
    token's and every level but the last) fit in `room` cells past the context."""
    while template:
        deepest = max_depth(template)
        if sum(len(path) < deepest for path in template) <= room:
            break
        template = tuple(path for path in template if len(path) < deepest)
    return template


def top_k_order(probs: np.ndarray, k: int) -> np.ndarray:
    """The k most probable token ids [k], best first, ties to the lower id (a full sort of a
    150k vocabulary per child cost more than the draft's forward pass on llama.cpp)."""
    k = min(k, probs.shape[0])
    kth = np.partition(probs, probs.shape[0] - k)[probs.shape[0] - k]  # the k-th largest value
    above = np.flatnonzero(probs > kth)
    top = np.concatenate([above, np.flatnonzero(probs == kth)[: k - above.size]])  # [k], ties to lower ids
    return top[np.lexsort((top, -probs[top]))]


def _depth(slots, i: int) -> int:
    depth = 1
    while slots[i].parent != -1:
        i = slots[i].parent
        depth += 1
    return depth


def calibrated_config(width: int, depth: int, relation: SamplingRelation) -> DraftConfig:
    """Width-W trees of depth D.  A sampled depth-1 template would be a one-position set, which
    the automatic choice verifies by SpecTr (i.i.d.) and nothing else (without replacement),
    while the trees the calibration feeds are verified per node by SpecInfer or Sequoia, with
    other slot acceptances; so sampled calibration at depth 1 grows one child under each slot,
    to be verified as a tree, and counts depth 1 only."""
    widths = [width] * depth
    if depth == 1 and relation in (SamplingRelation.IID, SamplingRelation.WITHOUT_REPLACEMENT):
        widths.append(1)
    return DraftConfig(tree=TreeTemplate(cartesian(widths)), relation=relation)


def _open(config: DraftConfig, resources: DrafterResources) -> DraftModelProposer:
    assert resources.draft is not None  # DrafterFamily.make refuses a missing draft first
    return DraftModelProposer(resources.draft, resources.target.info.tokenizer_hash, config)


FAMILY = DrafterFamily(
    name="draft-model",
    config=DraftConfig,
    contract=config_contract,
    shape=config_shape,
    build=_open,
    summary="a smaller model with the target's tokenizer drafts a chain or a tree",
    needs_draft_model=True,
    auto_candidate=True,
    auto_tree=True,
    calibrated=calibrated_config,
)
