"""Draft heads as proposers (Medusa: independent heads; Hydra, Hydra++ and Clover: dependent heads).

The heads read the target's hidden state of the row that predicted the pending token
(`HiddenStates.frontier_hidden`), which the verify forward that just ran produced: no extra
target forward per round.  A round expands an index-path template (Medusa's "choices") level
by level: Medusa computes every depth from that one state (one stage); Hydra runs head i once
per level, batched over the level's parents, each conditioned on its own path's embeddings;
Clover advances each parent's recurrent state by one step (its parent's state and its own
token).  A set with a context layer (Hydra++'s prefix layer, Clover's augmenting block) first
runs it over the rows committed since the last round (`PrefixState`, proposal-side state) and
reads its output at the frontier instead of the target's state.

Children are the head's top-k (relation `beam`: deterministic, so greedy or membership
verification) or drawn from its normalized q (`iid` or `without_replacement`: exact under
rejection, SpecInfer and Sequoia).  q is the head's softmax over the draft vocabulary under
the generation's sampling policy, zero outside it; a Medusa head's q at depth i does not
condition on the drafted parent, which is still a legitimate proposal law when sampled.
The round is the first that has no hidden state (the target has read nothing): it proposes
nothing, and the heads start from round 2.

Each level's head forward is a step of `drafting` (`proposers.base.SteppedProposer`): a
`HeadStep` (the level's parent rows), answered by `HeadForward.draft_many`, which runs the
heads once over the rows of every request that asks (a batch's requests at the same level, keyed
by the head set's manifest hash: the same weights), or alone over the request's own rows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator, Iterator, Sequence

import numpy as np
import torch

from draftwise.backends.base import Backend, supports_context_hidden, supports_hidden
from draftwise.runtime.contracts import (
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)
from draftwise.errors import BackendError, InputError
from draftwise.heads.arch import CloverHeads, DraftVocab, MedusaHeads
from draftwise.heads.artifact import HeadSet, load_heads
from draftwise.heads.defaults import default_heads
from draftwise.options import option
from draftwise.proposers.base import DraftRequest, RoundFeedback, propose_alone
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterResources
from draftwise.proposers.prefix_state import PrefixState
from draftwise.runtime.sampling import SamplingPolicy, sample
from draftwise.topology.templates import Template, chain, comb, max_depth, num_children, slots_by_parent
from draftwise.topology.tree_spec import AutoTree, TreeSpec, TreeTemplate, parse_tree, resolved_template, show_tree
from draftwise.verify.sequoia import without_replacement_q

RELATIONS = (SamplingRelation.BEAM, SamplingRelation.IID, SamplingRelation.WITHOUT_REPLACEMENT)


@dataclass(frozen=True)
class HeadsConfig:
    heads: str | None = option(None, help="head-set directory (draftwise heads train); default: the set committed "
                                          "for the target, if any")
    tree: TreeSpec | None = option(None, parse=parse_tree, show=show_tree,
                                   help="index paths (Medusa choices: JSON, chain:3, wbd:2,2,1, cartesian:3,2), a "
                                        "`tree optimize` directory, or auto; none: a chain through every head")
    relation: SamplingRelation = option(SamplingRelation.BEAM, help="children: beam (top-k) | iid | "
                                                                    "without_replacement (drawn from the head's q)")
    # like transformers' assistant_confidence_threshold: rows are spent only where the heads are sure
    confidence: float = option(0.0, help="drop top-k candidates whose head probability is below this (sampled "
                                         "children: stop expanding below them); 0 keeps the whole tree")

    # a budget for the auto tree, so trees of several sizes can be compared on one calibration
    tree_nodes: int | None = option(None, help="largest tree tree=auto considers, root included (default: the "
                                               "auto tree's own limit)")

    def __post_init__(self) -> None:
        if self.tree_nodes is not None:
            if self.tree_nodes < 2:
                raise InputError(f"tree_nodes must be at least 2 (the root and one draft), got {self.tree_nodes}")
            if not isinstance(self.tree, (AutoTree, TreeTemplate)):
                raise InputError("tree_nodes bounds tree=auto; pass tree=auto or drop tree_nodes")
            # an auto tree resolved under the budget keeps it, as a record and a check
            if isinstance(self.tree, TreeTemplate) and len(self.tree.paths) + 1 > self.tree_nodes:
                raise InputError(f"the tree has {len(self.tree.paths) + 1} nodes, more than tree_nodes="
                                 f"{self.tree_nodes}")
        if self.relation not in RELATIONS:
            raise InputError(f"head children are {', '.join(r.value for r in RELATIONS)}, not {self.relation.value}")
        if not 0.0 <= self.confidence < 1.0:
            raise InputError(f"confidence must be in [0, 1), got {self.confidence}")

    @property
    def template(self) -> Template | None:
        """The paths drawn from; an artifact or `auto` must have been resolved first."""
        return resolved_template(self.tree)


def config_contract(config: HeadsConfig) -> ProposerContract:
    if config.tree is None:
        return ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, config.relation, TopologyKind.SEQUENCE)
    if isinstance(config.tree, TreeTemplate) and max_depth(config.tree.paths) == 1:
        return ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, config.relation, TopologyKind.SET)
    return ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, config.relation, TopologyKind.TREE)


def config_shape(config: HeadsConfig) -> CandidateShape:
    if isinstance(config.tree, TreeTemplate):
        return CandidateShape(len(config.tree.paths), max_depth(config.tree.paths), True)
    return CandidateShape(0, 0, config.tree is not None)  # a chain through the heads: K is the head set's


class ExpandedDistributions(Mapping):
    """Parent -> q [V] (float64), built from the draft-vocabulary q [V_d] only when a verifier
    asks: greedy verification never reads q, and a 150k-entry vector per parent would cost more
    than the heads."""

    def __init__(self, token_map: np.ndarray, vocab_size: int, rows: dict[int, np.ndarray]) -> None:
        self._map, self._v, self._rows, self._full = token_map, vocab_size, rows, {}

    def __getitem__(self, parent: int) -> np.ndarray:
        if parent not in self._full:
            row = self._rows[parent]
            hit = next((k for k, r in self._full.items() if self._rows[k] is row), None)  # Medusa: shared per depth
            if hit is not None:
                self._full[parent] = self._full[hit]
            else:
                full = np.zeros(self._v)  # [V]
                full[self._map] = row
                self._full[parent] = full
        return self._full[parent]

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


@dataclass(frozen=True, eq=False)
class HeadStep:
    """One request's rows of one level: each parent's input state and its path (pending first).
    Medusa's one step computes depths 1..`level` from the frontier state."""

    level: int
    states: torch.Tensor  # [P, d]: h (Medusa, Hydra) or each parent's recurrent state before its token (Clover)
    paths: torch.Tensor  # [P, level] token ids, pending first (Hydra reads them all, Clover the last)


@dataclass(frozen=True, eq=False)
class HeadOut:
    logits: torch.Tensor  # [P, V_d] draft-vocabulary logits per parent; Medusa: [level, V_d] per depth
    states: torch.Tensor | None = None  # [P, d] Clover's recurrent state after each parent's token


class HeadForward:
    """The heads over many requests' rows: one forward for every step of one level (`draft_many`)."""

    def __init__(self, heads: HeadSet, vocab: DraftVocab, embed: torch.Tensor | None) -> None:
        self.heads, self.vocab, self.embed = heads.heads, vocab, embed  # embed [V, d]: dependent heads

    def draft_many(self, steps: Sequence[HeadStep]) -> list[HeadOut]:
        if len({step.level for step in steps}) > 1 and not isinstance(self.heads, MedusaHeads):
            raise InputError("one head forward serves one level")
        sizes = [step.states.shape[0] for step in steps]
        states = steps[0].states if len(steps) == 1 else torch.cat([step.states for step in steps])  # [sum P, d]
        with torch.inference_mode():
            if isinstance(self.heads, MedusaHeads):  # every depth from the one state: one stage
                depth = max(step.level for step in steps)
                per_depth = torch.stack([self.heads.head(i, states) for i in range(1, depth + 1)])  # [D, sum P, d]
                logits = self.heads.logits(per_depth, self.vocab)  # [D, sum P, V_d]
                return [HeadOut(part[: step.level, 0]) for step, part in zip(steps, logits.split(sizes, dim=1))]
            assert self.embed is not None
            paths = steps[0].paths if len(steps) == 1 else torch.cat([step.paths for step in steps])  # [sum P, level]
            level = steps[0].level
            if isinstance(self.heads, CloverHeads):
                after = self.heads.step(states, self.embed[paths[:, -1]])  # [sum P, d]: one recurrence step
                logits = self.vocab.logits(self.heads.predict(level, after))  # [sum P, V_d]
                return [HeadOut(lg, st) for lg, st in zip(logits.split(sizes), after.split(sizes))]
            logits = self.vocab.logits(self.heads.path_state(level, states, self.embed[paths]))  # [sum P, V_d]
            return [HeadOut(lg) for lg in logits.split(sizes)]


class HeadsProposer:
    phase = "propose"
    # propose reads the context and the target's committed state only: a proposal never verified
    # leaves nothing to undo, so the guard may ask for one in a plain round (`draftwise.runtime.shadow`)
    proposes_without_state = True

    def __init__(self, name: str, target: Backend, heads: HeadSet, config: HeadsConfig) -> None:
        if not supports_hidden(target):
            raise BackendError(f"backend {target.info.name} does not expose hidden states; draft heads need them")
        heads.check_target(target.info.checkpoint, target.info.tokenizer_hash)
        if heads.arch.family != name:
            raise InputError(f"{heads.provenance.get('family', heads.arch.family)} heads given to proposer {name}")
        weights = target.token_weights()  # type: ignore[attr-defined]
        if weights.lm_head.shape != (heads.arch.vocab_size, heads.arch.hidden_size):
            raise InputError(f"heads for a [{heads.arch.vocab_size}, {heads.arch.hidden_size}] LM head, the target's is "
                             f"{list(weights.lm_head.shape)}")
        self.name = name
        self.target = target
        self.headset = heads
        self.config = config
        self.contract = config_contract(config)
        self.vocab = DraftVocab(torch.from_numpy(weights.lm_head), heads.token_map)
        self.embed = torch.from_numpy(weights.embed) if heads.arch.dependent else None  # [V, d]
        self.token_map = heads.token_map.numpy()  # [V_d]
        self.draft_index = self.vocab.index_of().numpy()  # [V] target id -> draft index, -1 outside the map
        template = config.template
        self.template = chain(heads.arch.num_heads) if template is None else template
        if max_depth(self.template) > heads.arch.num_heads:
            raise InputError(f"tree of depth {max_depth(self.template)} for {heads.arch.num_heads} heads")
        self._policy = SamplingPolicy()
        self._rng = np.random.default_rng(0)
        layer = getattr(heads.heads, "prefix", None)
        if layer is not None and not supports_context_hidden(target):
            raise BackendError(f"{name} heads with a context layer read every committed row's hidden state, which "
                               f"backend {target.info.name} does not keep; use the transformers backend or a set "
                               "trained without prefix")
        self.prefix = PrefixState(layer, target) if layer is not None else None
        self._track()
        self.last_seconds: dict[str, float] = {}

    def _track(self) -> None:
        self.target.track_hidden()  # type: ignore[attr-defined]
        if self.prefix is not None:
            self.target.track_context()  # type: ignore[attr-defined]

    def identity(self) -> dict:
        return {"name": self.name, "heads": self.headset.manifest_hash, "arch": self.headset.arch.as_dict(),
                "template": self.template, "relation": self.contract.relation.value}

    def begin(self, policy: SamplingPolicy, rng: np.random.Generator) -> None:
        self._policy, self._rng = policy, rng
        self._track()  # the engine switched tracking off for the generation

    def observe(self, feedback: RoundFeedback) -> None:
        pass  # the next frontier state is the heads' input; a context layer syncs its KV in `propose`

    def frontier_state(self, context: Sequence[int]) -> torch.Tensor | None:
        """The heads' input h [d]: the target's state at the row that predicted the pending
        token, or the context layer's output there; None before the target has read anything."""
        if self.prefix is not None:
            return self.prefix.frontier(context)
        if self.target.cached_len != len(context) - 1:
            return None
        h = self.target.frontier_hidden()  # type: ignore[attr-defined]
        return None if h is None else torch.from_numpy(np.asarray(h, dtype=np.float32))

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        return propose_alone(self._drafting(context, manifest_hash, max_depth, alone=True))

    def drafting(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None,
                 ) -> Generator[DraftRequest, Any, ProposalResult]:
        return self._drafting(context, manifest_hash, max_depth, alone=False)

    def _drafting(self, context: Sequence[int], manifest_hash: str, max_depth: int | None, alone: bool,
                  ) -> Generator[DraftRequest, Any, ProposalResult]:
        """`alone`: each level's head forward runs at once (no step leaves the generator)."""
        template = self.template
        self.last_seconds = {}
        if max_depth is not None:
            template = tuple(p for p in template if len(p) <= max_depth)
        nodes: list[ProposalNode] = []
        rows: dict[int, np.ndarray] = {}
        clock = time.perf_counter()
        h = self.frontier_state(context) if template else None
        context_seconds = time.perf_counter() - clock
        if template and h is not None:
            nodes, rows = yield from self._expand(int(context[-1]), h, template, alone)
            if self.prefix is not None:
                self.last_seconds["context"] = context_seconds
        return ProposalResult(
            nodes=tuple(nodes), contract=self.contract, source=self.name, manifest_hash=manifest_hash,
            distributions=ExpandedDistributions(self.token_map, self.headset.arch.vocab_size, rows),
            seconds=dict(self.last_seconds),
        )

    @property
    def forward(self) -> HeadForward:
        """The heads' forward (over this request's rows alone, or a batch's at the same level)."""
        return HeadForward(self.headset, self.vocab, self.embed)

    def _step(self, step: HeadStep, alone: bool) -> Generator[DraftRequest, Any, HeadOut]:
        """One level's head forward: at once alone, else yielded for a batch to answer with every request's."""
        if alone:
            return self.forward.draft_many([step])[0]
        level = 0 if isinstance(self.headset.heads, MedusaHeads) else step.level  # Medusa's depths mix in one call
        out: HeadOut = yield DraftRequest((self.headset.manifest_hash, level), self.forward, step)
        return out

    def _expand(self, pending: int, h: torch.Tensor, template: Template, alone: bool,
                ) -> Generator[DraftRequest, Any, tuple[list[ProposalNode], dict[int, np.ndarray]]]:
        slots = slots_by_parent(template)
        widths = num_children(template)
        depth_of = [len(p) for p in template]  # canonical order: by depth
        node_of: dict[int, int] = {}  # template node -> proposal node
        tokens_of: dict[int, list[int]] = {-1: [pending]}  # proposal node -> its path's tokens, pending first
        nodes: list[ProposalNode] = []
        rows: dict[int, np.ndarray] = {}
        self.last_seconds = {}
        medusa_logits: torch.Tensor | None = None
        clover_state: dict[int, torch.Tensor] = {}  # proposal node -> the recurrent state after its token [d]
        unsure: set[int] = set()  # template nodes below which nothing is drafted (sampled, under the threshold)
        for level in range(1, max(depth_of) + 1):
            clock = time.perf_counter()
            members = [i for i, d in enumerate(depth_of) if d == level
                       and (slots[i].parent == -1 or (slots[i].parent in node_of and slots[i].parent not in unsure))]
            if not members:
                break
            parents = sorted({slots[i].parent for i in members})
            parent_nodes = [-1 if p == -1 else node_of[p] for p in parents]
            paths = torch.tensor([tokens_of[n] for n in parent_nodes])  # [P, level]
            if isinstance(self.headset.heads, MedusaHeads):
                if medusa_logits is None:  # every depth from the one state: one stage
                    medusa_logits = (yield from self._step(HeadStep(max(depth_of), h[None], paths[:1]), alone)).logits  # [D, V_d]
                level_logits = medusa_logits[level - 1][None].expand(len(parents), -1)  # [P, V_d], one row shared
                shared = True
            elif isinstance(self.headset.heads, CloverHeads):
                previous = torch.stack([h if n == -1 else clover_state[nodes[n].parent] for n in parent_nodes])  # [P, d]
                out = yield from self._step(HeadStep(level, previous, paths), alone)
                assert out.states is not None
                clover_state.update(zip(parent_nodes, out.states))
                level_logits, shared = out.logits, False  # [P, V_d]
            else:
                level_logits = (yield from self._step(HeadStep(level, h[None].expand(len(parents), -1), paths), alone)).logits
                shared = False  # [P, V_d]
            probs = self._policy.probs(level_logits[:1].numpy() if shared else level_logits.numpy())  # [P or 1, V_d]
            sure = torch.softmax(level_logits, dim=-1) if self.config.confidence else None  # [P, V_d] raw head law
            for k, (parent, parent_node) in enumerate(zip(parents, parent_nodes)):
                q = probs[0 if shared else k]  # [V_d]
                rows[parent_node] = q if not shared else probs[0]
                chosen = self._children(q, level_logits[k], widths[parent])  # target ids
                for i in [m for m in members if slots[m].parent == parent]:
                    token = chosen[slots[i].slot]
                    index = int(self.draft_index[token])  # -1: outside the draft vocabulary, q = 0 there
                    if sure is not None and (index < 0 or float(sure[k, index]) < self.config.confidence):
                        if self.contract.relation is SamplingRelation.BEAM:
                            continue  # deterministic candidates: any subset verifies exactly (greedy, membership)
                        unsure.add(i)  # a drawn child is verified whatever its value; only its subtree goes
                    node_of[i] = len(nodes)
                    tokens_of[len(nodes)] = tokens_of[parent_node] + [token]
                    nodes.append(ProposalNode(token=token, parent=parent_node, depth=level,
                                              q=float(q[index]) if index >= 0 else 0.0, source=self.name))
            self.last_seconds[f"head{level}"] = time.perf_counter() - clock
        return nodes, rows

    def _children(self, q: np.ndarray, logits: torch.Tensor, width: int) -> list[int]:
        """Target token ids of a parent's `width` children, in slot order (q [V_d])."""
        relation = self.contract.relation
        if relation is SamplingRelation.BEAM:
            return [int(t) for t in self.token_map[logits.topk(width).indices.numpy()]]  # deterministic top-k of the head
        if relation is SamplingRelation.IID:
            return [int(self.token_map[sample(q, self._rng)]) for _ in range(width)]
        drawn: list[int] = []  # draft indices
        tokens: list[int] = []
        for _ in range(width):
            rest = np.array(q, dtype=np.float64)
            rest[drawn] = 0.0
            if rest.sum() > 0.0:
                drawn.append(sample(without_replacement_q(q, drawn), self._rng))
                tokens.append(int(self.token_map[drawn[-1]]))
            else:
                # q is spent (a top-k or top-p policy left fewer tokens than children): Sequoia's
                # fallback is uniform over the tokens not drawn yet, and its verifier reads that law
                # over the target's whole vocabulary, so it is drawn there, not over the draft vocabulary
                spent = np.zeros(self.headset.arch.vocab_size)  # [V]
                tokens.append(sample(without_replacement_q(spent, tokens), self._rng))
        return tokens


def open_heads(name: str, config: HeadsConfig, resources: DrafterResources) -> HeadsProposer:
    target = resources.target
    directory = Path(config.heads) if config.heads else default_heads(name, target.info.checkpoint)
    return HeadsProposer(name, target, load_heads(directory), config)


def calibrated(width: int, depth: int, relation: SamplingRelation) -> HeadsConfig:
    """A comb: `width` children at every level, the first of them continuing to `depth`, so each
    head's slot acceptances are counted along the path the target most often takes."""
    return HeadsConfig(tree=TreeTemplate(comb(width, depth)), relation=relation)


def family(name: str, summary: str) -> DrafterFamily[HeadsConfig]:
    return DrafterFamily(
        name=name, config=HeadsConfig, contract=config_contract, shape=config_shape,
        build=lambda config, resources: open_heads(name, config, resources),
        summary=summary, auto_tree=True, calibrated=calibrated, reads_hidden=True,
        auto_candidate=True,  # where a head set ships or was trained for the target; else listed as skipped
    )
