"""Kangaroo (`--proposer kangaroo`, docs/drafters.md, "Kangaroo"): the target's first l layers, a trained
adapter (one attention layer, two norms) and the target's LM head draft for the full target.

The draft pass is `LayerSkipBackend` with every layer from l on skipped and the adapter as its
exit: its own cache holds rows for the l shallow layers and the adapter only; the target's
cache is never touched.  `DraftModelProposer` drives it: a chain of at most k tokens that
exits early after a token whose draft probability is below eta (greedy: the top-1
probability, the paper's rule), or a tree level by level.  Sampled drafts carry the adapter's
normalized q (exact under rejection and SpecInfer); greedy drafts are its argmax.

`eta=auto` and `adapter=auto` (`AutoEta`, `AutoAdapter`) are chosen by measured time per
committed token before decoding (`draftwise.plan`, `optimize.kangaroo_auto`); this module
only parses and carries them, and refuses to draft with one left unresolved.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator, Sequence

from draftwise.backends.base import Backend
from draftwise.backends.transformers import TransformersBackend
from draftwise.runtime.contracts import ProposalResult, ProposerContract, SamplingRelation
from draftwise.errors import BackendError, InputError
from draftwise.options import option
from draftwise.proposers.base import DraftRequest
from draftwise.proposers.draft_model import DraftConfig, config_contract, config_shape
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterResources
from draftwise.proposers.layer_skip import SelfDraftProposer
from draftwise.topology.tree_spec import TreeSpec, TreeTemplate, parse_tree, show_tree


@dataclass(frozen=True)
class AutoEta:
    """`eta=auto`: the early-exit threshold with the least measured time per committed token."""

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class AutoAdapter:
    """`adapter=auto`: of every adapter found for the target (one per exit layer), the one with
    the least measured time per committed token."""

    def __str__(self) -> str:
        return "auto"


def parse_eta(text: str) -> float | AutoEta:
    stripped = text.strip()
    if stripped == "auto":
        return AutoEta()
    try:
        return float(stripped)
    except ValueError:
        raise InputError(f"eta={text!r}: a number in [0, 1) or auto") from None


def parse_adapter(text: str) -> str | AutoAdapter | None:
    """'auto', 'none' (the default adapter) or a directory (a directory named auto: ./auto)."""
    stripped = text.strip()
    if stripped == "auto":
        return AutoAdapter()
    return None if stripped.lower() in ("", "none") else stripped


def show_setting(value: object) -> str:
    return "none" if value is None else str(value)


# the contract and the candidate shape do not depend on eta (it only ends a chain sooner), so a
# config whose eta is still `auto` is planned and checked with this stand-in
_PLANNING_ETA = 0.0


@dataclass(frozen=True)
class KangarooConfig:
    adapter: str | AutoAdapter | None = option(
        None, parse=parse_adapter, show=show_setting,
        help="adapter directory (draftwise adapter train); default: the one shipped or trained for the target; "
             "auto: the fastest of the adapters shipped or in the cache for the target, measured before decoding")
    k: int = option(6, help="longest chain (the paper's gamma)")
    eta: float | AutoEta = option(0.6, parse=parse_eta, show=show_setting,
                                  help="early exit: stop the chain after a drafted token the draft gave less than "
                                       "eta; auto: the fastest of a fixed grid, measured before decoding")
    tree: TreeSpec | None = option(None, parse=parse_tree, show=show_tree,
                                   help="tree mode: chain:4, wbd:2,2,1, cartesian:3,2, JSON paths")
    relation: SamplingRelation = option(SamplingRelation.IID, help="tree children: iid | without_replacement | beam")
    reuse: bool = option(True, help="chains: offer the shallow rows to a target that can start its verify at the "
                                    "exit layer (ShallowReuseBackend); each row is reused only where may_reuse holds")

    def __post_init__(self) -> None:
        if self.tree is not None and not isinstance(self.tree, TreeTemplate):
            raise InputError("kangaroo trees are index paths (chain:4, wbd:2,2,1, cartesian:3,2, JSON paths)")
        if isinstance(self.eta, AutoEta) and self.tree is not None:
            raise InputError("eta=auto chooses where a chain exits early; a tree never does (drop eta or tree)")
        self.planned_draft_config()  # the draft-model checks (k, eta in [0, 1), relation)

    @property
    def unresolved(self) -> tuple[str, ...]:
        """The keys still `auto` (to be measured by `draftwise.plan` before decoding)."""
        return tuple(key for key, value in (("adapter", self.adapter), ("eta", self.eta))
                     if isinstance(value, (AutoAdapter, AutoEta)))

    def draft_config(self) -> DraftConfig:
        """The drafting settings; an `auto` eta must have been resolved first."""
        if isinstance(self.eta, AutoEta):
            raise InputError("eta=auto is not resolved yet (draftwise.open_decoder measures it before decoding)")
        return DraftConfig(k=self.k, confidence_threshold=self.eta, tree=self.tree, relation=self.relation)

    def planned_draft_config(self) -> DraftConfig:
        """The drafting settings to plan and check with: the contract and shape, not a draft."""
        eta = _PLANNING_ETA if isinstance(self.eta, AutoEta) else self.eta
        return DraftConfig(k=self.k, confidence_threshold=eta, tree=self.tree, relation=self.relation)


def contract(config: KangarooConfig) -> ProposerContract:
    return config_contract(config.planned_draft_config())


def shape(config: KangarooConfig) -> CandidateShape:
    return config_shape(config.planned_draft_config())


class KangarooProposer(SelfDraftProposer):
    """Kangaroo, offering its shallow rows to a target that can start a verify at the boundary
    (`ShallowReuseBackend`): the pending token's and every drafted token it fed, each with the
    metadata the target checks (`may_reuse`) before it reuses the row."""

    def __init__(self, draft: Backend, config: KangarooConfig, target: object, checkpoint: str,
                 boundary: int, identity: dict[str, object]) -> None:
        super().__init__("kangaroo", draft, config.draft_config(), None, dict(identity))
        self.target = target
        self.verifying_target: TransformersBackend | None = None  # set when the engine must verify with a view
        self.checkpoint = checkpoint
        self.boundary = boundary
        # a verify that starts at the boundary reuses rows a pass of this request's own recorded
        self.reuse = (config.reuse and config.tree is None and callable(getattr(target, "declare_boundary", None))
                      and callable(getattr(draft, "shallow_row", None)))
        if self.reuse:
            draft.record_boundary = boundary  # type: ignore[attr-defined]
            target.declare_boundary(boundary)  # type: ignore[attr-defined]

    def drafting(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None,
                 ) -> Generator[DraftRequest, Any, ProposalResult]:
        result = yield from super().drafting(context, manifest_hash, max_depth)
        if self.reuse:
            self._offer(len(context) - 1)
        return result

    def _offer(self, pending_position: int) -> None:
        from draftwise.backends.shallow_reuse import ShallowMeta, ShallowRow, ancestry

        self.draft.forget_shallow(pending_position)  # type: ignore[attr-defined]
        fed = list(self.driver._cached)  # the tokens whose rows the draft holds, in position order
        generation = int(self.target.generation)  # type: ignore[attr-defined]
        rows = []
        for position in range(pending_position, len(fed)):
            held = self.draft.shallow_row(position)  # type: ignore[attr-defined]
            if held is None:
                break
            meta = ShallowMeta(self.checkpoint, self.boundary, fed[position], position, ancestry(fed[: position + 1]),
                               self.draft.info.dtype, generation)
            rows.append(ShallowRow(meta, held[0], held[1]))
        self.target.offer(rows)  # type: ignore[attr-defined]


def open_kangaroo(config: KangarooConfig, resources: DrafterResources) -> SelfDraftProposer:
    from draftwise.backends.layer_skip import LayerSkipBackend, draft_pass_host
    from draftwise.backends.shallow_reuse import ShallowReuseBackend
    from draftwise.selfdraft.adapter import default_adapter, load_adapter
    from draftwise.selfdraft.skipset import SkipSet

    target = draft_pass_host(resources.target)  # alone: the target; in a batch: the model the slots share
    if target is None:
        raise BackendError(f"Kangaroo runs the target's shallow layers on the transformers backend, not "
                           f"{resources.target.info.name} (llama.cpp's public API evaluates every layer)")
    if config.unresolved:
        raise InputError(f"{', '.join(config.unresolved)}=auto is not resolved yet (draftwise.open_decoder measures it "
                         "before decoding)")
    assert not isinstance(config.adapter, AutoAdapter)  # for the type checker: refused just above
    directory = Path(config.adapter) if config.adapter else default_adapter(target.info.checkpoint)
    adapter_set = load_adapter(directory)
    adapter_set.check_target(target.info.checkpoint, target.info.tokenizer_hash, target.model)
    adapter = adapter_set.build(target.model)
    arch = adapter_set.arch
    draft = LayerSkipBackend(target, SkipSet.shallow(arch.layers, arch.exit_layer), exit=adapter, label="kangaroo",
                             exit_key=adapter_set.manifest_hash)
    identity = {"adapter": adapter_set.manifest_hash, "exit_layer": arch.exit_layer, "eta": config.eta,
                "reuse": config.reuse}
    # in a batch the slot verifies as it is: the shared forward runs every request's rows from
    # layer 0, so no verify starts at the boundary (`reuse` applies to a request alone)
    verifying: object = resources.target
    if (resources.target is target and isinstance(target, TransformersBackend) and config.reuse and config.tree is None
            and not isinstance(target, ShallowReuseBackend)):
        verifying = ShallowReuseBackend.of(target)  # the same loaded model; the engine verifies with this view
    # in a batch the pass is shared: every request's draft step runs in one composed forward
    drafting = draft if resources.passes is None else resources.passes.slot(draft)
    proposer = KangarooProposer(drafting, config, verifying, target.info.checkpoint, arch.exit_layer, identity)
    proposer.verifying_target = None if verifying is resources.target else verifying  # type: ignore[assignment]
    return proposer


FAMILY = DrafterFamily(
    name="kangaroo",
    config=KangarooConfig,
    contract=contract,
    shape=shape,
    build=open_kangaroo,
    summary="Kangaroo: the target's first l layers + a trained adapter + its LM head, early exit below eta",
    drafts_on_target=True,
    auto_candidate=True,  # where an adapter ships or was trained for the target; else listed as skipped
)
