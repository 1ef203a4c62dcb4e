"""Building a decoder from a planned spec: proposers, the verifier bound to their contracts, the gate.

The last stage of `open_decoder`'s one pass down (parse -> plan -> build): `build` takes a
`Plan` (a concrete spec on loaded backends, with the choices that made it concrete) and
returns the `Decoder`.  Everything here is concrete: a spec whose `auto` choices are still
open is refused with a pointer to `draftwise.plan`, which settles them (the planner sits above
this module and calls it to measure candidates; this module never calls it).  The defaults
live in the frozen config dataclasses of each component; this module only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence, TypeVar

from draftwise.backends.base import Backend
from draftwise.backends.batch import BatchBackend
from draftwise.runtime.engine import Engine
from draftwise.runtime.guard import DoNoHarm
from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.runtime.round import GenerationConfig, GenerationResult, RequestRounds
from draftwise.runtime.strategy import RoundStrategy
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.errors import InputError
from draftwise.runtime.gate import CostGateConfig
from draftwise.proposers.base import Proposer
from draftwise.proposers.family import DraftPasses, DrafterFamily, DrafterResources
from draftwise.spec import (AutoGate, Choice, DecoderSpec, GateProfile, Guard, concrete_drafter, fitted_generation,
                            members)
from draftwise.runtime.text_stream import TextPieces
from draftwise.verify.registry import make_verifier

Prompt = str | Sequence[int]
R = TypeVar("R", bound=RequestRounds)


@dataclass(frozen=True)
class Plan:
    """What the planner hands the builder: `spec` concrete (every auto chosen), `requested` as
    asked, the loaded backends, and what each auto became."""

    spec: DecoderSpec
    requested: DecoderSpec
    target: Backend
    draft: Backend | None
    choices: tuple[Choice, ...] = ()


@dataclass(frozen=True)
class Decoder:
    """A built decoder on loaded backends.  `spec` is concrete (every auto chosen);
    `requested` is what was asked for, and `choices` says what each auto became."""

    spec: DecoderSpec
    requested: DecoderSpec
    target: Backend
    draft: Backend | None
    engine: SpeculativeDecoder
    choices: tuple[Choice, ...] = ()

    @property
    def verifier(self) -> str:
        return self.engine.verifier.capabilities.name

    def prompt_ids(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids of `prompt` (text, through the chat template when `chat`; or ids as given)."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if chat:
            return self.target.chat_prompt([{"role": "user", "content": prompt}])
        return self.target.tokenize(prompt)

    def generate(self, prompt: Prompt, chat: bool = False,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        return self.engine.generate(self.prompt_ids(prompt, chat), on_tokens=on_tokens)

    def stream(self, prompt: Prompt, chat: bool = False) -> Iterator[str]:
        """The generated text, piece by piece as rounds commit it."""
        pieces = TextPieces(self.target.detokenize, self.target.info.eos_token_ids)
        rounds = self.engine.rounds(self.prompt_ids(prompt, chat))
        try:
            for tokens in rounds:
                piece = pieces.feed(tokens)
                if piece:
                    yield piece
        finally:
            rounds.close()  # an abandoned stream still leaves the target consistent
        tail = pieces.finish()
        if tail:
            yield tail

    def with_spec(self, spec: DecoderSpec) -> "Decoder":
        """Another concrete configuration on the same backends (a plain reference, another length)."""
        return replace(self, spec=spec, requested=spec, engine=build_decoder(spec, self.target, self.draft), choices=())

    def plain(self) -> "Decoder":
        return self.with_spec(self.spec.plain())

    def batch(self, max_batch: int | None = None) -> Engine:
        """A batch engine on this decoder's target: up to `max_batch` (default: the spec's
        `batch=`, which `gate=auto` was planned for) requests share each round
        (`submit`, `cancel`, `step`, `events`, `generate_many`), each with this configuration and
        its own generation settings."""
        from draftwise.backends.load import open_batch

        return batch_decoder(self.spec, open_batch(self.target, max_batch or self.spec.max_batch), self.draft)

    def generate_many(self, prompts: Sequence[Prompt], chat: bool = False, max_batch: int | None = None,
                      configs: Sequence[GenerationConfig] | None = None) -> list[GenerationResult | BaseException]:
        """Every prompt decoded in shared rounds (up to `max_batch` at once, default the spec's
        `batch=`, the rest joining as
        others finish); each entry the request's result or the error it alone ended with.
        `configs`: per-request generation settings (max_new_tokens, policy, seed, stop strings;
        tree limits, exactness and the gate stay this decoder's)."""
        ids = [self.prompt_ids(p, chat) for p in prompts]
        return self.batch(max_batch).generate_many(ids, configs)

    def sized(self, max_new_tokens: int) -> "Decoder":
        generation = replace(self.spec.generation, max_new_tokens=max_new_tokens)
        return replace(self, engine=build_decoder(replace(self.spec, generation=generation), self.target, self.draft))


def build(plan: Plan) -> Decoder:
    """The decoder of a planned spec."""
    engine = build_decoder(plan.spec, plan.target, plan.draft)
    return Decoder(plan.spec, plan.requested, plan.target, plan.draft, engine, plan.choices)


def make_proposers(spec: DecoderSpec, target: Backend, draft: Backend | None = None,
                   passes: DraftPasses | None = None) -> list[Proposer]:
    resources = DrafterResources(target, draft, passes)
    return [member.family.make(member.config, resources) for member in members(concrete_drafter(spec))]


def gate_config(spec: DecoderSpec, target: Backend | BatchBackend) -> CostGateConfig | None:
    """The cost gate's settings from a measured verify profile of this target and backend."""
    if spec.gate is None:
        return None
    if isinstance(spec.gate, AutoGate):
        raise InputError("gate auto is measured after loading: plan the spec first (draftwise.open_decoder does)")
    assert isinstance(spec.gate, GateProfile)
    profile = VerifyCostProfile.load(spec.gate.directory)
    _check_measured(profile, spec.gate.directory, target)
    batches = None if spec.gate.batches is None else BatchCostProfile.load(spec.gate.batches)
    for measured in () if batches is None else batches.by_batch.values():
        _check_measured(measured, spec.gate.batches, target)
    return CostGateConfig(profile, batch_profile=batches)


def _check_measured(profile: VerifyCostProfile, directory: object, target: Backend | BatchBackend) -> None:
    if (profile.model, profile.backend) != (target.info.checkpoint, target.info.name):
        raise InputError(f"gate profile {directory} measured {profile.model} on {profile.backend}, "
                         f"not {target.info.checkpoint} on {target.info.name}; measure this target's (--gate auto)")


def build_decoder(spec: DecoderSpec, target: Backend, draft: Backend | None = None) -> SpeculativeDecoder:
    """The engine of a concrete spec on loaded backends."""
    return _engine(spec, target, draft, gate_config(spec, target))


def _engine(spec: DecoderSpec, target: Backend, draft: Backend | None, gate: CostGateConfig | None,
            passes: DraftPasses | None = None, kind: type[R] = SpeculativeDecoder) -> R:  # type: ignore[assignment]
    """A request's decoder of `kind`: one that decodes alone (`SpeculativeDecoder`) or a request
    of an engine's batch (`RequestRounds`)."""
    proposers = make_proposers(spec, target, draft, passes)
    verifier = make_verifier(spec.verifier, [p.contract for p in proposers], spec.generation.policy)
    generation = replace(fitted_generation(spec), gate=gate)
    return kind(verifying_target(proposers, target), proposers, verifier, generation)


def batch_decoder(spec: DecoderSpec, target: BatchBackend, draft: Backend | None = None) -> Engine:
    """A batch engine for a concrete spec: each request gets its own engine (proposers, verifier
    bound for its policy, gate state) on its own slot of `target`."""
    from draftwise.backends.batch import DraftSlot, keeps_hidden
    from draftwise.backends.layer_skip import draft_pass_host
    from draftwise.backends.layer_skip_batch import ComposedDrafts
    from draftwise.backends.load import draft_batch

    drafter = concrete_drafter(spec)
    own_draft = drafter is not None and spec.uses_draft_model
    # a self-drafter composes the loaded model's layers for each request, on a cache of its own
    composes = draft_pass_host(target) is not None
    for member in members(drafter):  # every source of a union runs per request too
        family = member.family
        if not (family.batched or family.needs_draft_model or (family.reads_hidden and keeps_hidden(target))
                or (family.drafts_on_target and composes)):
            families = ", ".join(f.name for f in _batched_families())
            why = ("reads the target's hidden states, which this backend's batch slots do not keep" if family.reads_hidden
                   else "runs the target's own layers as its draft, which this backend cannot compose per request"
                   if family.drafts_on_target else "has no batched form")
            raise InputError(f"proposer {member.name} {why}; batched decoding on {target.info.name} runs {families}, "
                             f"draft-model{', the head families' if keeps_hidden(target) else ''}"
                             f"{', the self-drafters' if composes else ''} or none")
    drafts = None  # the draft model as a batch: a slot per request, every request's draft step in one forward
    if own_draft:  # refused before any work where a request cannot have a draft model of its own
        if draft is None:
            raise InputError("proposer draft-model needs a draft model (--draft MODEL)")
        drafts = draft_batch(draft, target.max_slots)
    # the self-drafters' passes, shared: every request's draft step of a round in one composed forward
    passes = (ComposedDrafts(target.max_slots) if composes and any(m.family.drafts_on_target for m in members(drafter))
              else None)
    gate = gate_config(spec, target)  # the profile is read once, for every request

    def decoder_for(slot: Backend, config: GenerationConfig) -> RequestRounds:
        generation = replace(spec.generation, max_new_tokens=config.max_new_tokens, policy=config.policy,
                             seed=config.seed, stop_strings=config.stop_strings)
        # each request drafts on a slot of its own (its own KV), freed with it (`SpeculativeDecoder.close`)
        request_draft = DraftSlot(drafts, drafts.open()) if drafts is not None else draft
        try:
            return _engine(replace(spec, generation=generation), slot, request_draft, gate, passes, RequestRounds)
        except BaseException:
            if isinstance(request_draft, DraftSlot):
                request_draft.close()
            raise

    strategy = RoundStrategy(DoNoHarm() if spec.guard is not Guard.OFF and drafter is not None else None,
                             None if gate is None else gate.batch_profile, target.info.prompt_shares_round)
    return Engine(target, decoder_for, spec.generation, strategy)


def _batched_families() -> list[DrafterFamily[Any]]:
    from draftwise.proposers.registry import DRAFTERS

    return [f for f in DRAFTERS.families() if f.batched]


def verifying_target(proposers: list[Proposer], target: Backend) -> Backend:
    """The target, or the view of it a proposer asked to be verified by (Kangaroo's shallow
    reuse: the same loaded model, whose verify may start at the exit layer for the rows the
    draft offers; every row still checked by `may_reuse`)."""
    views = [view for p in proposers if (view := getattr(p, "verifying_target", None)) is not None]
    return views[0] if views else target
