"""Assembling a decoder from names: backends, proposers and the verifier.

The CLI and the benchmark harness both build through here, so a configuration means the
same thing everywhere.  The defaults live in the frozen config dataclasses of each
component; this module only reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Callable

from draftwise.backends.base import Backend
from draftwise.contracts import ProbabilitySemantics, ProposerContract, SamplingRelation, TopologyKind
from draftwise.engine import GenerationConfig, SpeculativeDecoder
from draftwise.gate import CostGateConfig, check_gateable
from draftwise.models import DEFAULT_MODEL, ResolvedModel, resolve
from draftwise.proposers.base import Proposer
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer, draft_contract
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer
from draftwise.topology.compile import TreeLimits
from draftwise.topology.templates import Template, from_paths, parse_template
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
    tree: str | None = None  # draft-model tree: "wbd:2,2,1", "cartesian:3,2,2", JSON paths, or a tree artifact dir
    relation: str = "iid"  # how draft-tree children are drawn: iid, without_replacement, beam (top-k)
    index: str | None = None  # REST datastore directory
    gate: str | None = None  # cost gate: "auto" (measure t(n) once, cached) or a verify_profile directory
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
    return fitted_generation(spec).limits.max_nodes


DRAFT_LEAVES_FLOOR = 64  # what a tree artifact chosen later (`--tree auto`) may need; small enough to cost little


def draft_leaves_needed(spec: DecoderSpec) -> int:
    """Leaf sequences a draft model's llama.cpp context needs to re-read its tree level by level:
    the leaves of the tree above its last level (a new leaf takes over its parent's sequence);
    0 for a chain.  Transformers backends ignore it."""
    template = draft_template(spec)
    if template is None:
        return 0
    deepest = max(map(len, template), default=0)
    above = {path for path in template if len(path) < deepest}
    parents = {path[:-1] for path in above}
    leaves = sum(path not in parents for path in above)
    return max(DRAFT_LEAVES_FLOOR, leaves)


def unused_options(spec: DecoderSpec) -> list[str]:
    """Options given that the chosen proposer would silently ignore (the CLI refuses them)."""
    unused = []
    if spec.draft and spec.proposer not in ("draft-model", "auto"):
        unused.append(f"--draft is for --proposer draft-model (or auto), not {spec.proposer}")
    if spec.tree and spec.proposer != "draft-model":
        unused.append(f"--tree shapes a draft-model tree, not a {spec.proposer} proposal")
    if spec.index and spec.proposer not in ("rest", "auto"):
        unused.append(f"--index is for --proposer rest (or auto), not {spec.proposer}")
    return unused


def draft_template(spec: DecoderSpec) -> Template | None:
    """The draft tree: a template spec, or a directory written by `draftwise tree optimize`,
    whose paths are used only under the sampling policy it was optimized for."""
    if not spec.tree:
        return None
    # a JSON list of paths is a template, never a directory (and may be longer than a file name may)
    looks_like_path = not spec.tree.lstrip().startswith("[") and ("/" in spec.tree or spec.tree.startswith("."))
    if looks_like_path and not Path(spec.tree).is_dir():
        raise ValueError(f"tree {spec.tree!r}: no such tree directory (from `draftwise tree optimize`)")
    if not spec.tree.lstrip().startswith("[") and Path(spec.tree).is_dir():
        from draftwise.optimize.select import load_tree_artifact

        artifact = load_tree_artifact(Path(spec.tree))
        wanted = spec.generation.policy.as_dict()
        if dict(artifact.policy) != wanted:
            raise ValueError(
                f"tree {spec.tree} was optimized under sampling policy {dict(artifact.policy)}, not {wanted}; "
                "calibrate and optimize again for this policy"
            )
        return from_paths(artifact.choice.paths)
    return parse_template(spec.tree)


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
            config = replace(config, template=draft_template(spec), relation=SamplingRelation(spec.relation))
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
        return [draft_contract(draft_template(spec), SamplingRelation(spec.relation))]
    return [ProposerContract(ProbabilitySemantics.FREQUENCY, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)]


def preflight(spec: DecoderSpec) -> str:
    """Bind the verifier to the planned contracts before any model is loaded; return its name."""
    if spec.gate is not None:
        if spec.proposer == "none":
            raise ValueError("the cost gate cuts proposals, and proposer none makes none")
        if spec.gate != "auto" and not Path(spec.gate).is_dir():
            raise ValueError(f"gate must be auto or a verify_profile directory (draftwise profile --out DIR); "
                             f"{spec.gate!r} is neither")
    contracts = planned_contracts(spec)
    verifier = make_verifier(spec.verifier, contracts, spec.generation.policy)
    bind(verifier, contracts, spec.generation.policy, exact=spec.generation.exact)
    if spec.gate is not None:
        check_gateable(verifier.capabilities)
    return verifier.capabilities.name


def proposal_shape(spec: DecoderSpec) -> tuple[int, int]:
    """(nodes, depth) the configured proposer can produce in one round; (0, 0) when unknown
    in advance (REST tries are pruned by the index's own node budget)."""
    if spec.proposer == "prompt-lookup":
        lookup = spec.prompt_lookup
        return lookup.num_tokens * lookup.max_candidates, lookup.num_tokens
    if spec.proposer == "draft-model":
        template = draft_template(spec)
        if template is None:
            return spec.draft_config.k, spec.draft_config.k
        return len(template), max(map(len, template), default=0)
    return 0, 0


def fitted_generation(spec: DecoderSpec) -> GenerationConfig:
    """The generation config with tree limits raised to the proposer's configured shape.
    A draft whose tail the compiler cuts is paid for and never verified: a k = 20 chain under
    the 16-deep default verified 17 tokens per round where transformers verifies 21."""
    nodes, depth = proposal_shape(spec)
    limits = spec.generation.limits
    if nodes <= limits.max_nodes and depth <= limits.max_depth:
        return spec.generation
    return replace(spec.generation, limits=TreeLimits(max(limits.max_nodes, nodes), max(limits.max_depth, depth)))


def gate_config(spec: DecoderSpec, target: Backend, generation: GenerationConfig,
                progress: Callable[[str], None] | None = None) -> CostGateConfig | None:
    """The cost gate's settings: the target's verify profile over every row count a round of
    this configuration can verify, measured on first use (`auto`) or read from a directory."""
    if not spec.gate:
        return None
    from draftwise.optimize.hardware import VerifyCostProfile

    if spec.gate == "auto":
        from draftwise.models import cache_dir
        from draftwise.optimize.auto import auto_gate_profile

        nodes, _ = proposal_shape(spec)  # (0, 0) when unknown in advance: the tree limit bounds it
        max_rows = 1 + (min(nodes, generation.limits.max_nodes) if nodes else generation.limits.max_nodes)
        chain = tree_leaves_needed(spec) == 0  # every proposer is a sequence
        return CostGateConfig(auto_gate_profile(target, max_rows, cache_dir().parent / "auto", progress=progress,
                                                chain=chain))
    profile = VerifyCostProfile.load(Path(spec.gate))
    if (profile.model, profile.backend) != (target.info.checkpoint, target.info.name):
        raise ValueError(f"gate profile {spec.gate} measured {profile.model} on {profile.backend}, "
                         f"not {target.info.checkpoint} on {target.info.name}; measure this target's (--gate auto)")
    return CostGateConfig(profile)


def build_decoder(spec: DecoderSpec, target: Backend, draft: Backend | None = None,
                  progress: Callable[[str], None] | None = None) -> SpeculativeDecoder:
    proposers = make_proposers(spec, target, draft)
    verifier = make_verifier(spec.verifier, [p.contract for p in proposers], spec.generation.policy)
    generation = fitted_generation(spec)
    if spec.gate:
        generation = replace(generation, gate=gate_config(spec, target, generation, progress))
    return SpeculativeDecoder(target, proposers, verifier, generation)


def default_threads() -> int:
    return os.cpu_count() or 1
