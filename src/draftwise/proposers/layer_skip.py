"""Draft & Verify (`--proposer layer-skip`, docs/drafters.md, "Draft & Verify"): the target drafts for itself
with a skip set applied, and the full target verifies.

The draft pass is `LayerSkipBackend` (the target's modules, a skip vector over attention and
MLP sublayers, its own cache); `DraftModelProposer` drives it exactly as it drives a separate
draft model: a chain that stops after a token the draft gave less than gamma (or a tree),
prefix sync and rollback with the round.  gamma is fixed, or steered by the EMA rule toward a
target acceptance rate (`GammaController`); either way only the draft's own numbers decide
where it stops, so exactness is untouched.  Contracts: sampled drafts carry their normalized
q (exact under rejection sampling and SpecInfer); greedy drafts are the draft's argmax.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generator, Sequence

import numpy as np

from draftwise.backends.base import Backend
from draftwise.runtime.contracts import ProposalResult, ProposerContract, SamplingRelation
from draftwise.errors import BackendError, InputError
from draftwise.options import option
from draftwise.proposers.base import DraftRequest, RoundFeedback, propose_alone
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer, config_contract, config_shape
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterResources
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.tree_spec import TreeSpec, TreeTemplate, parse_tree, show_tree

MAX_GAMMA = 0.999  # a threshold of 1 would stop after every token; the draft-model config refuses it


@dataclass(frozen=True)
class GammaRule:
    """Draft & Verify's EMA rule for its adaptive draft-exiting threshold;
    its defaults are the config's (`LayerSkipConfig`), defined there once."""

    beta1: float  # EMA weight of the past acceptance rate
    beta2: float  # EMA weight of the past gamma
    eps: float  # step of gamma's candidate per round
    target: float  # acceptance rate gamma is steered toward

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2", "target"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InputError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.eps < 1.0:
            raise InputError(f"eps must be in (0, 1), got {self.eps}")


class GammaController:
    """gamma per round: ema = b1 ema + (1 - b1) acc; cand = gamma + eps if ema <= target else
    gamma - eps; gamma = b2 gamma + (1 - b2) cand.  Low acceptance raises gamma (stop drafting
    sooner), high acceptance lowers it (draft deeper)."""

    def __init__(self, gamma: float, rule: GammaRule, carry: bool = False) -> None:
        self.rule = rule
        self.carry = carry  # begin() keeps the state of the generations before
        self.start = gamma
        self.gamma = gamma
        self.ema = rule.target  # no evidence yet: as if on target

    def reset(self) -> None:
        self.gamma, self.ema = self.start, self.rule.target

    def update(self, round_acceptance: float) -> float:
        rule = self.rule
        self.ema = rule.beta1 * self.ema + (1.0 - rule.beta1) * round_acceptance
        candidate = self.gamma + rule.eps if self.ema <= rule.target else self.gamma - rule.eps
        self.gamma = min(max(rule.beta2 * self.gamma + (1.0 - rule.beta2) * candidate, 0.0), MAX_GAMMA)
        return self.gamma


@dataclass(frozen=True)
class LayerSkipConfig:
    # no default set: a searched one is per target, and the rule is a baseline, not a choice
    skip: str | None = option(None, help="skip set (required): a `draftwise skip search` directory, every-other "
                                         "(layers 1, 3, ... skipped), empty (nothing skipped), or bits:0101... (attention, MLP per layer)")
    k: int = option(12, help="longest chain (a round never drafts deeper)")
    gamma: float = option(0.6, help="stop the chain after a drafted token the draft gave less than gamma (the "
                                    "starting value when adaptive)")
    adaptive: bool = option(True, help="chains: steer gamma by the EMA rule toward target_acceptance; false: fixed "
                                          "gamma")
    # the EMA rule's settings, defined here once (GammaRule takes them from the config)
    beta1: float = option(0.5, help="adaptive gamma: EMA weight of the past acceptance rate")
    beta2: float = option(0.9, help="adaptive gamma: EMA weight of the past gamma")
    eps: float = option(0.01, help="adaptive gamma: step of gamma's candidate per round")
    target_acceptance: float = option(0.9, help="adaptive gamma: the acceptance rate gamma is steered toward")
    # off by default: a seeded generation then drafts the same whatever the decoder ran before
    carry: bool = option(False, help="adaptive gamma: keep the steered gamma and its acceptance EMA from one "
                                     "generation to the next (the decoder's lifetime, as a served model); false: "
                                     "restart from gamma at each generation")
    tree: TreeSpec | None = option(None, parse=parse_tree, show=show_tree,
                                   help="tree mode instead of a chain: chain:4, wbd:2,2,1, cartesian:3,2, JSON paths")
    relation: SamplingRelation = option(SamplingRelation.IID, help="tree children: iid | without_replacement | beam")

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= MAX_GAMMA:
            raise InputError(f"gamma must be in [0, {MAX_GAMMA}], got {self.gamma}")
        if self.tree is not None and not isinstance(self.tree, TreeTemplate):
            raise InputError("layer-skip trees are index paths (chain:4, wbd:2,2,1, cartesian:3,2, JSON paths)")
        _ = self.rule  # the rule's own checks
        self.draft_config(self.gamma)  # the draft-model checks (k, relation) apply as they are

    @property
    def rule(self) -> GammaRule:
        return GammaRule(self.beta1, self.beta2, self.eps, self.target_acceptance)

    def draft_config(self, gamma: float) -> DraftConfig:
        return DraftConfig(k=self.k, confidence_threshold=gamma, tree=self.tree, relation=self.relation)


def contract(config: LayerSkipConfig) -> ProposerContract:
    return config_contract(config.draft_config(config.gamma))


def shape(config: LayerSkipConfig) -> CandidateShape:
    return config_shape(config.draft_config(config.gamma))


class SelfDraftProposer:
    """A draft backend built from the target (layer skip, or Kangaroo's shallow exit), driven by
    `DraftModelProposer`, with an optional gamma controller over its confidence stop."""

    phase = "propose"

    def __init__(self, name: str, draft: Backend, config: DraftConfig,
                 controller: GammaController | None, identity: dict[str, Any]) -> None:
        self.name = name
        self.driver = DraftModelProposer(draft, draft.info.tokenizer_hash, config)
        self.driver.name = name
        self.contract = self.driver.contract
        self.controller = controller
        self._identity = identity

    @property
    def draft(self) -> Backend:
        """The draft pass: a `LayerSkipBackend` alone, a slot of a `LayerSkipBatch` in a batch."""
        return self.driver.draft

    def close(self) -> None:
        """Free the request's slot on a batch's shared pass (its draft KV) when it leaves."""
        self.driver.close()

    @property
    def gamma(self) -> float:
        return self.driver.config.confidence_threshold

    def identity(self) -> dict[str, Any]:
        return {**self.driver.identity(), **self._identity, "name": self.name}

    def begin(self, policy: SamplingPolicy, rng: np.random.Generator) -> None:
        if self.controller is not None:
            if not self.controller.carry:
                self.controller.reset()
            self._set_gamma(self.controller.gamma)
        self.driver.begin(policy, rng)

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        return propose_alone(self.drafting(context, manifest_hash, max_depth))

    def drafting(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None,
                 ) -> Generator[DraftRequest, Any, ProposalResult]:
        """`propose` in steps (`SteppedProposer`): in a batch each draft forward goes up to the
        batch, which answers it on this request's own draft pass."""
        return (yield from self.driver.drafting(context, manifest_hash, max_depth))

    def observe(self, feedback: RoundFeedback) -> None:
        self.driver.observe(feedback)
        drafted = len(feedback.result.nodes)
        if self.controller is not None and drafted:
            self._set_gamma(self.controller.update(len(feedback.accepted) / drafted))

    def _set_gamma(self, gamma: float) -> None:
        # the draft-model config is frozen: the stop threshold is swapped, nothing else changes
        self.driver.config = dataclasses.replace(self.driver.config, confidence_threshold=gamma)


def open_layer_skip(config: LayerSkipConfig, resources: DrafterResources) -> SelfDraftProposer:
    from draftwise.backends.layer_skip import LayerSkipBackend, draft_pass_host
    from draftwise.selfdraft.skipset import resolve_skip

    target = draft_pass_host(resources.target)  # alone: the target; in a batch: the model the slots share
    if target is None:
        raise BackendError(f"layer skipping runs on the transformers backend, not {resources.target.info.name}: "
                           "llama.cpp's public API evaluates every layer (pass --backend transformers)")
    if config.skip is None:
        raise InputError("proposer layer-skip needs skip=DIR (a `draftwise skip search` artifact for this target) or "
                         "skip=every-other (the simple rule)")
    skip, source = resolve_skip(config.skip, int(target.model.config.num_hidden_layers), target.info.checkpoint,
                                target.info.tokenizer_hash)
    controller = (GammaController(config.gamma, config.rule, config.carry) if config.adaptive and config.tree is None
                  else None)
    identity = {"skip": skip.bits(), "skip_source": source, "adaptive": controller is not None,
                "gamma": config.gamma, "rule": dataclasses.asdict(config.rule), "carry": config.carry}
    draft = LayerSkipBackend(target, skip)
    # in a batch the pass is shared: every request's draft step runs in one composed forward
    return SelfDraftProposer("layer-skip", draft if resources.passes is None else resources.passes.slot(draft),
                             config.draft_config(config.gamma), controller, identity)


FAMILY = DrafterFamily(
    name="layer-skip",
    config=LayerSkipConfig,
    contract=contract,
    shape=shape,
    build=open_layer_skip,
    summary="Draft & Verify: the target drafts with a (searched) set of attention/MLP sublayers skipped",
    drafts_on_target=True,
    auto_candidate=True,  # with skip= given (`--proposer auto --set skip=DIR`); else listed as skipped
)
