"""What is refused before any model is loaded: options the chosen proposer would ignore, a
missing draft model, and a verifier that cannot be bound to the proposers' contracts.

Incompatible proposer/verifier pairs are refused here, before any target work.  The planner
calls it for the spec it was given and for each `auto` candidate; nothing here loads or
measures anything.
"""

from __future__ import annotations

from draftwise.backends.dtype import DEFAULT_DTYPE
from draftwise.runtime.contracts import ProposerContract
from draftwise.errors import InputError
from draftwise.runtime.gate import check_gateable
from draftwise.spec import DecoderSpec, concrete_drafter, members
from draftwise.verify.base import bind
from draftwise.verify.registry import make_verifier


def unused_options(spec: DecoderSpec) -> list[str]:
    """Options given that the chosen proposer would silently ignore (refused before loading)."""
    if spec.draft and not spec.uses_draft_model:
        return [f"--draft is for a proposer that drafts with a model (draft-model, or auto), not {spec.proposer}"]
    if spec.backend == "llamacpp" and spec.dtype != DEFAULT_DTYPE:
        return [f"dtype {spec.dtype} configures the transformers backend; llama.cpp computes in the GGUF's own types"]
    return []


def planned_contracts(spec: DecoderSpec) -> list[ProposerContract]:
    """The proposers' contracts, known from the configuration alone (no model loaded)."""
    return [m.contract for m in members(concrete_drafter(spec))]


def preflight(spec: DecoderSpec) -> str:
    """Bind the verifier to the planned contracts before any model is loaded; return its name."""
    unused = unused_options(spec)
    if unused:
        raise InputError("; ".join(unused))
    drafter = concrete_drafter(spec)
    if drafter is not None and spec.uses_draft_model and not spec.draft:
        raise InputError(f"proposer {drafter.name} needs draft=MODEL (--draft: a model sharing the target's tokenizer)")
    if spec.gate is not None and drafter is None:
        raise InputError("the cost gate cuts proposals, and proposer none makes none")
    contracts = planned_contracts(spec)
    verifier = make_verifier(spec.verifier, contracts, spec.generation.policy)
    bind(verifier, contracts, spec.generation.policy, exact=spec.generation.exact)
    if spec.gate is not None:
        check_gateable(verifier.capabilities)
    return verifier.capabilities.name
