"""Building a decoder from a concrete spec: backends, proposers and the verifier.

Everything here is concrete: a spec whose `auto` choices are still open is refused with a
pointer to `draftwise.resolve`, which settles them (it plans from measurements, so it sits
above the planning layer; this module sits below it).  The defaults live in the frozen
config dataclasses of each component; this module only reads them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from dataclasses import replace

from draftwise.backends.base import Backend
from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice, check_dtype
from draftwise.contracts import ProposerContract
from draftwise.cost_profile import VerifyCostProfile
from draftwise.engine import GenerationConfig, SpeculativeDecoder
from draftwise.errors import InputError
from draftwise.gate import CostGateConfig, check_gateable
from draftwise.models import ResolvedModel, resolve
from draftwise.proposers.base import Proposer
from draftwise.proposers.family import DrafterResources
from draftwise.spec import BACKENDS, AutoDrafter, AutoGate, DecoderSpec, DrafterSpec, GateProfile
from draftwise.topology.compile import TreeLimits
from draftwise.verify.base import bind
from draftwise.verify.registry import make_verifier


if TYPE_CHECKING:
    from draftwise.backends.invariance import StrictScope

def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(name: str, model: ResolvedModel) -> str:
    """`auto`: llama.cpp for GGUF files when llama-cpp-python is installed, else transformers."""
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    return "llamacpp" if model.kind == "gguf" and llamacpp_available() else "transformers"


def load_backend(model_name: str, backend: str = "auto", threads: int | None = None, device: str = "cpu",
                 dtype: DtypeChoice = DEFAULT_DTYPE, strict: StrictScope | None = None) -> Backend:
    """A backend for `model_name`; it sizes its own per-round resources when a decoder starts.
    `dtype` is the transformers backend's (float32, bfloat16, or auto: the faster here, measured
    once and cached); llama.cpp runs the GGUF's own types and takes only the default.  `strict`
    ("chains" or "trees"): llama.cpp with the kernels whose verify rows of that shape are
    bit-identical to plain decoding's, capped at the rows the invariance probe measured exact
    (probed on first use, cached)."""
    check_dtype(dtype)  # before anything is loaded
    model = resolve(model_name)
    kind = choose_backend(backend, model)
    if strict and kind != "llamacpp":
        raise InputError(f"strict chooses the llama.cpp backend's kernels; {model_name!r} runs on {kind}")
    if strict:
        from draftwise.backends.invariance import load_strict

        return load_strict(model, threads, scope=strict)
    if kind == "llamacpp":
        if model.kind != "gguf":
            raise InputError(f"the llamacpp backend loads .gguf models; {model_name!r} is a {model.kind}")
        if dtype != DEFAULT_DTYPE:
            raise InputError(f"dtype {dtype} configures the transformers backend; llama.cpp computes in the GGUF's "
                             "own types (pass --backend transformers, or leave dtype at its default)")
        from draftwise.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend.load(model, n_threads=threads)
    import torch

    from draftwise.backends.transformers import TransformersBackend

    if threads:
        torch.set_num_threads(threads)
    if dtype == "auto":
        from draftwise.backends.dtype import choose_dtype

        chosen, _ = choose_dtype(lambda d: TransformersBackend.load(model, device=device, dtype=d),
                                 model.checkpoint_id, torch.get_num_threads(), device)
        return chosen
    return TransformersBackend.load(model, device=device, dtype=dtype)


def unused_options(spec: DecoderSpec) -> list[str]:
    """Options given that the chosen proposer would silently ignore (refused before loading)."""
    if spec.draft and not spec.uses_draft_model:
        return [f"--draft is for a proposer that drafts with a model (draft-model, or auto), not {spec.proposer}"]
    if spec.backend == "llamacpp" and spec.dtype != DEFAULT_DTYPE:
        return [f"dtype {spec.dtype} configures the transformers backend; llama.cpp computes in the GGUF's own types"]
    return []


def concrete_drafter(spec: DecoderSpec) -> DrafterSpec | None:
    if isinstance(spec.drafter, AutoDrafter):
        raise InputError("proposer auto is chosen after loading: resolve the spec first (draftwise.open_decoder does)")
    return spec.drafter


def planned_contracts(spec: DecoderSpec) -> list[ProposerContract]:
    """The proposers' contracts, known from the configuration alone (no model loaded)."""
    drafter = concrete_drafter(spec)
    return [] if drafter is None else [drafter.contract]


def preflight(spec: DecoderSpec) -> str:
    """Bind the verifier to the planned contracts before any model is loaded; return its name."""
    unused = unused_options(spec)
    if unused:
        raise InputError("; ".join(unused))
    drafter = concrete_drafter(spec)
    if drafter is not None and drafter.family.needs_draft_model and not spec.draft:
        raise InputError(f"proposer {drafter.name} needs draft=MODEL (--draft: a model sharing the target's tokenizer)")
    if spec.gate is not None and drafter is None:
        raise InputError("the cost gate cuts proposals, and proposer none makes none")
    contracts = planned_contracts(spec)
    verifier = make_verifier(spec.verifier, contracts, spec.generation.policy)
    bind(verifier, contracts, spec.generation.policy, exact=spec.generation.exact)
    if spec.gate is not None:
        check_gateable(verifier.capabilities)
    return verifier.capabilities.name


def proposal_shape(spec: DecoderSpec) -> tuple[int, int]:
    """(nodes, depth) the configured proposer can produce in one round; (0, 0) when unknown in
    advance (bounded by the tree limits)."""
    drafter = concrete_drafter(spec)
    if drafter is None:
        return 0, 0
    shape = drafter.shape
    return shape.rows, shape.depth


def fitted_generation(spec: DecoderSpec) -> GenerationConfig:
    """The generation config with tree limits raised to the proposer's configured shape.
    A draft whose tail the compiler cuts is paid for and never verified: a k = 20 chain under
    the 16-deep default verified 17 tokens per round where transformers verifies 21."""
    nodes, depth = proposal_shape(spec)
    limits = spec.generation.limits
    if nodes <= limits.max_nodes and depth <= limits.max_depth:
        return spec.generation
    return replace(spec.generation, limits=TreeLimits(max(limits.max_nodes, nodes), max(limits.max_depth, depth)))


def make_proposers(spec: DecoderSpec, target: Backend, draft: Backend | None = None) -> list[Proposer]:
    drafter = concrete_drafter(spec)
    if drafter is None:
        return []
    return [drafter.family.make(drafter.config, DrafterResources(target, draft))]


def gate_config(spec: DecoderSpec, target: Backend) -> CostGateConfig | None:
    """The cost gate's settings from a measured verify profile of this target and backend."""
    if spec.gate is None:
        return None
    if isinstance(spec.gate, AutoGate):
        raise InputError("gate auto is measured after loading: resolve the spec first (draftwise.open_decoder does)")
    assert isinstance(spec.gate, GateProfile)
    profile = VerifyCostProfile.load(spec.gate.directory)
    if (profile.model, profile.backend) != (target.info.checkpoint, target.info.name):
        raise InputError(f"gate profile {spec.gate} measured {profile.model} on {profile.backend}, "
                         f"not {target.info.checkpoint} on {target.info.name}; measure this target's (--gate auto)")
    return CostGateConfig(profile)


def build_decoder(spec: DecoderSpec, target: Backend, draft: Backend | None = None) -> SpeculativeDecoder:
    proposers = make_proposers(spec, target, draft)
    verifier = make_verifier(spec.verifier, [p.contract for p in proposers], spec.generation.policy)
    generation = replace(fitted_generation(spec), gate=gate_config(spec, target))
    return SpeculativeDecoder(verifying_target(proposers, target), proposers, verifier, generation)


def verifying_target(proposers: list[Proposer], target: Backend) -> Backend:
    """The target, or the view of it a proposer asked to be verified by (Kangaroo's shallow
    reuse: the same loaded model, whose verify may start at the exit layer for the rows the
    draft offers; every row still checked by `may_reuse`)."""
    views = [view for p in proposers if (view := getattr(p, "verifying_target", None)) is not None]
    return views[0] if views else target


def default_threads() -> int:
    return os.cpu_count() or 1
