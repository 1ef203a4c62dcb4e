"""Assembling a decoder from names: backends, proposers and the verifier.

The CLI and the benchmark harness both build through here, so a configuration means the
same thing everywhere.  The defaults live in the frozen config dataclasses of each
component; this module only reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable

from draftwise.backends.base import Backend
from draftwise.contracts import ProbabilitySemantics, ProposerContract, SamplingRelation, TopologyKind
from draftwise.engine import GenerationConfig, SpeculativeDecoder
from draftwise.models import DEFAULT_MODEL, ResolvedModel, resolve
from draftwise.proposers.base import Proposer
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer, draft_contract
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer
from draftwise.topology.templates import parse_template
from draftwise.verify.base import bind
from draftwise.verify.registry import make_verifier

PROPOSERS = ("none", "prompt-lookup", "draft-model", "rest")
BACKENDS = ("auto", "transformers", "llamacpp")


@dataclass(frozen=True)
class DecoderSpec:
    """Everything that names one decoding configuration."""

    target: str = DEFAULT_MODEL
    backend: str = "auto"
    proposer: str = "prompt-lookup"
    draft: str | None = None
    verifier: str = "auto"
    prompt_lookup: PromptLookupConfig = PromptLookupConfig()
    draft_config: DraftConfig = DraftConfig()
    tree: str | None = None  # tree template for draft-model trees ("wbd:2,2,1", "cartesian:3,2,2", JSON paths)
    relation: str = "iid"  # how draft-tree children are drawn: iid, without_replacement, beam (top-k)
    index: str | None = None  # REST datastore directory
    threads: int | None = None
    device: str = "cpu"
    generation: GenerationConfig = field(default_factory=GenerationConfig)


def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(name: str, model: ResolvedModel) -> str:
    """`auto`: llama.cpp for GGUF files when llama-cpp-python is installed, else transformers."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    return "llamacpp" if model.kind == "gguf" and llamacpp_available() else "transformers"


def load_backend(model_name: str, backend: str = "auto", threads: int | None = None, device: str = "cpu",
                 progress: Callable[[str], None] | None = None, max_tree_leaves: int = 64) -> Backend:
    model = resolve(model_name, progress=progress)
    kind = choose_backend(backend, model)
    if kind == "llamacpp":
        if model.kind != "gguf":
            raise ValueError(f"the llamacpp backend loads .gguf models; {model_name!r} is a {model.kind}")
        from draftwise.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend.load(model, n_threads=threads, max_tree_leaves=max_tree_leaves)
    import torch

    from draftwise.backends.transformers import TransformersBackend

    if threads:
        torch.set_num_threads(threads)
    return TransformersBackend.load(model, device=device, progress=progress)


def tree_leaves_needed(spec: DecoderSpec) -> int:
    """Leaf sequences the target's llama.cpp context needs: 0 for chains (one sequence is
    measurably faster there), else the node budget (a tree never has more leaves than nodes)."""
    contracts = planned_contracts(spec)
    if all(c.topology is TopologyKind.SEQUENCE for c in contracts):
        return 0
    return spec.generation.limits.max_nodes


def make_proposers(spec: DecoderSpec, target: Backend, draft: Backend | None = None) -> list[Proposer]:
    if spec.proposer not in PROPOSERS:
        raise ValueError(f"unknown proposer {spec.proposer!r}; choose one of {', '.join(PROPOSERS)}")
    if spec.proposer == "none":
        return []
    if spec.proposer == "prompt-lookup":
        return [PromptLookupProposer(spec.prompt_lookup)]
    if spec.proposer == "draft-model":
        if draft is None:
            raise ValueError("--proposer draft-model needs --draft MODEL (a model sharing the target's tokenizer)")
        config = spec.draft_config
        if spec.tree:
            config = replace(config, template=parse_template(spec.tree), relation=SamplingRelation(spec.relation))
        return [DraftModelProposer(draft, target.info.tokenizer_hash, config)]
    if not spec.index:
        raise ValueError("--proposer rest needs --index DIR (build one with `draftwise index build`)")
    from draftwise.proposers.retrieval.proposer import RestProposer

    return [RestProposer.open(spec.index, target.info.tokenizer_hash)]


def planned_contracts(spec: DecoderSpec) -> list[ProposerContract]:
    """The proposers' contracts, known from the configuration alone (no model loaded)."""
    if spec.proposer == "none":
        return []
    if spec.proposer == "prompt-lookup":
        return [PromptLookupProposer(spec.prompt_lookup).contract]
    if spec.proposer == "draft-model":
        template = parse_template(spec.tree) if spec.tree else None
        return [draft_contract(template, SamplingRelation(spec.relation))]
    return [ProposerContract(ProbabilitySemantics.FREQUENCY, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)]


def preflight(spec: DecoderSpec) -> str:
    """Bind the verifier to the planned contracts before any model is loaded; return its name."""
    contracts = planned_contracts(spec)
    verifier = make_verifier(spec.verifier, contracts, spec.generation.policy)
    bind(verifier, contracts, spec.generation.policy, exact=spec.generation.exact)
    return verifier.capabilities.name


def build_decoder(spec: DecoderSpec, target: Backend, draft: Backend | None = None) -> SpeculativeDecoder:
    proposers = make_proposers(spec, target, draft)
    verifier = make_verifier(spec.verifier, [p.contract for p in proposers], spec.generation.policy)
    return SpeculativeDecoder(target, proposers, verifier, spec.generation)


def default_threads() -> int:
    return os.cpu_count() or 1
