"""Kangaroo (`--proposer kangaroo`, HEADS.md section 7): the target's first l layers, a trained
adapter (one attention layer, two norms) and the target's LM head draft for the full target.

The draft pass is `LayerSkipBackend` with every layer from l on skipped and the adapter as its
exit: its own cache holds rows for the l shallow layers and the adapter only; the target's
cache is never touched.  `DraftModelProposer` drives it: a chain of at most k tokens that
exits early after a token whose draft probability is below eta (greedy: the top-1
probability, the paper's rule), or a tree level by level.  Sampled drafts carry the adapter's
normalized q (exact under rejection and SpecInfer); greedy drafts are its argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftwise.backends.transformers import TransformersBackend
from draftwise.contracts import ProposerContract, SamplingRelation
from draftwise.errors import BackendError, InputError
from draftwise.options import option
from draftwise.proposers.draft_model import DraftConfig, config_contract, config_shape
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterResources
from draftwise.proposers.layer_skip import SelfDraftProposer
from draftwise.topology.tree_spec import TreeSpec, TreeTemplate, parse_tree, show_tree


@dataclass(frozen=True)
class KangarooConfig:
    adapter: str | None = option(None, help="adapter directory (draftwise adapter train); default: the one shipped "
                                            "or trained for the target")
    k: int = option(6, help="longest chain (the paper's gamma)")
    eta: float = option(0.6, help="early exit: stop the chain after a drafted token the draft gave less than eta")
    tree: TreeSpec | None = option(None, parse=parse_tree, show=show_tree,
                                   help="tree mode: chain:4, wbd:2,2,1, cartesian:3,2, JSON paths")
    relation: SamplingRelation = option(SamplingRelation.IID, help="tree children: iid | without_replacement | beam")

    def __post_init__(self) -> None:
        if self.tree is not None and not isinstance(self.tree, TreeTemplate):
            raise InputError("kangaroo trees are index paths (chain:4, wbd:2,2,1, cartesian:3,2, JSON paths)")
        self.draft_config()  # the draft-model checks (k, eta in [0, 1), relation)

    def draft_config(self) -> DraftConfig:
        return DraftConfig(k=self.k, confidence_threshold=self.eta, tree=self.tree, relation=self.relation)


def contract(config: KangarooConfig) -> ProposerContract:
    return config_contract(config.draft_config())


def shape(config: KangarooConfig) -> CandidateShape:
    return config_shape(config.draft_config())


def open_kangaroo(config: KangarooConfig, resources: DrafterResources) -> SelfDraftProposer:
    from draftwise.backends.layer_skip import LayerSkipBackend
    from draftwise.selfdraft.adapter import default_adapter, load_adapter
    from draftwise.selfdraft.skipset import SkipSet

    target = resources.target
    if not isinstance(target, TransformersBackend):
        raise BackendError(f"Kangaroo runs the target's shallow layers on the transformers backend, not "
                           f"{target.info.name} (llama.cpp's public API evaluates every layer)")
    directory = Path(config.adapter) if config.adapter else default_adapter(target.info.checkpoint)
    adapter_set = load_adapter(directory)
    adapter_set.check_target(target.info.checkpoint, target.info.tokenizer_hash, target.model)
    adapter = adapter_set.build(target.model)
    arch = adapter_set.arch
    draft = LayerSkipBackend(target, SkipSet.shallow(arch.layers, arch.exit_layer), exit=adapter, label="kangaroo")
    identity = {"adapter": adapter_set.manifest_hash, "exit_layer": arch.exit_layer, "eta": config.eta}
    return SelfDraftProposer("kangaroo", draft, config.draft_config(), None, identity)


FAMILY = DrafterFamily(
    name="kangaroo",
    config=KangarooConfig,
    contract=contract,
    shape=shape,
    build=open_kangaroo,
    summary="Kangaroo: the target's first l layers + a trained adapter + its LM head, early exit below eta",
    auto_candidate=True,  # where an adapter ships or was trained for the target; else listed as skipped
)
