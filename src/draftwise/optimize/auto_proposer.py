"""`--proposer auto`: the proposer (and whether to gate it) with the best predicted time per
committed token on this target, backend and machine.

Candidates: plain decoding; prompt lookup and, with an index, REST, each with and without
the cost gate; with a draft model under greedy decoding, its chain; every head family whose
heads ship (or were trained) for the target, at the tree `--tree auto` plans for it; and the
heterogeneous rounds of a free source with each later candidate (prompt-lookup+rest,
prompt-lookup+hydra++, prompt-lookup+draft-model), with and without the gate.  Each is replayed
(`replay.py`) on plain traces of the calibration prompts, and its time predicted from the
traces' measured steps, the measured verify profile t(n) and the proposer's own measured
time.  Artifacts are measured on first use and cached, keyed by everything they depend
on (another model, backend, thread count, sampling policy, prompt set or generation length
lands in another directory; a tampered one is measured again):

    traces    the target decoding every calibration prompt alone (tokens + timings)
    hidden    the target's states along the traces (`trace_hidden.py`), only where a head
              family is a candidate: the heads are replayed on them
    profile   t(n) over every row count a candidate can verify, of the shape the loaded
              context verifies (the gated candidates' gate reads the same directory)
    heads     each head family's tree, as `--tree auto` plans it (shared with it)

A candidate the requested verifier cannot bind to, or that the replay cannot predict (a
draft model when sampling: its verifier accepts with min(1, p/q)), is listed as skipped
with the reason, never silently dropped.
"""

from __future__ import annotations

import logging

import json
import shutil
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from draftwise.artifacts import stable_hash, write_manifest
from draftwise.backends.base import Backend, BackendInfo, TokenWeights
from draftwise.build import build_decoder, make_proposers
from draftwise.spec import fitted_generation, proposal_shape
from draftwise.preflight import preflight
from draftwise.errors import DraftwiseError, InputError
from draftwise.spec import AutoDrafter, AutoGate, DecoderSpec, DrafterSpec, GateProfile, Guard, UnionDrafter
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.gate import CostGateConfig
from draftwise.optimize.auto import AutoTreeConfig, artifact_matches, auto_gate_directory, ensure_profile, gate_rows
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.replay import Trace, predicted_seconds, replay, trace_eos, trace_from_records
from draftwise.optimize.trace_backend import HiddenTraceBackend
from draftwise.optimize.trace_hidden import TraceHidden, ensure_hidden
from draftwise.proposers.base import Proposer
from draftwise.proposers.kangaroo import KangarooConfig
from draftwise.topology.templates import from_paths
from draftwise.topology.tree_spec import TreeTemplate
from draftwise.verify.registry import VERIFIERS

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

TRACES_KIND = "plain_traces"
TRACES_FILE = "traces.json"
WARMUP_TOKENS = 4  # decoded untimed before the traces
# the traces' plain step and the profile's one-row verify agree within this factor on an idle
# machine; a trace set or a profile cached while another job ran timed its step far slower than
# an idle machine does (benchmarks/heterogeneous/)
STEP_AGREEMENT = 1.3
ROUND_BOOKKEEPING_S = 0.005  # the engine's own time per round, on top of the forward: tiny models' whole step


@dataclass(frozen=True)
class CandidateScore:
    name: str
    seconds_per_token: float  # predicted, over all calibration prompts
    speedup: float  # plain's predicted seconds per token / this one's
    mean_accepted: float  # accepted candidates per round after the first
    rounds: int
    tokens_per_s: tuple[float, ...]  # [traces] predicted, per calibration prompt (Spec-Bench averages these)


@dataclass(frozen=True)
class ProposerChoice:
    chosen: str
    spec: DecoderSpec  # the configuration to decode with: a concrete proposer, gate resolved
    scores: tuple[CandidateScore, ...]  # best first
    skipped: tuple[tuple[str, str], ...]  # (candidate, why)
    traces_directory: Path
    profile_directory: Path

    def table(self) -> str:
        width = max([22, *(len(s.name) + 1 for s in self.scores)])
        lines = [f"{'candidate':<{width}} {'s/token':>9} {'speedup':>8} {'accepted':>9}"]
        if self.spec.guard is Guard.ON and self.spec.drafter is not None:
            lines.insert(0, "behind the do-no-harm guard: plain steps wherever the rounds measure them faster")
        for s in self.scores:
            mark = "  <- chosen" if s.name == self.chosen else ""
            lines.append(f"{s.name:<{width}} {s.seconds_per_token:>9.4f} {s.speedup:>7.2f}x {s.mean_accepted:>9.2f}{mark}")
        lines += [f"{name:<{width}} skipped: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def candidate_specs(spec: DecoderSpec, has_draft: bool) -> tuple[list[tuple[str, DecoderSpec]], list[tuple[str, str]]]:
    """(name, concrete spec; gate `AutoGate` standing for the shared profile) for every
    candidate of `--proposer auto`, and the skipped ones with their reason.  Settings the user
    gave (lookup length, index, draft k, verifier, limits) carry into every candidate."""
    assert isinstance(spec.drafter, AutoDrafter)
    base = replace(spec, drafter=None, gate=None, draft=None)
    named: list[tuple[str, DecoderSpec]] = [("plain", base)]
    skipped: list[tuple[str, str]] = []
    singles: list[DrafterSpec] = []
    for drafter in spec.drafter.candidates:
        family = drafter.family
        if family.needs_draft_model:
            if not has_draft:
                continue
            if not spec.generation.policy.greedy:
                skipped.append((family.name, "a sampling draft is accepted with min(1, p/q), which a trace cannot "
                                             f"replay; choose its tree with --proposer {family.name} --tree auto"))
                continue
        draft = spec.draft if family.needs_draft_model else None
        named.append((family.name, replace(base, drafter=drafter, draft=draft)))
        if family.free_to_ask:
            named.append((f"{family.name}+gate", replace(base, drafter=drafter, draft=draft, gate=AutoGate())))
        singles.append(drafter)
    for union in unions_of(singles):  # a free source merged with another: one round, both proposals
        draft = spec.draft if union.needs_draft_model else None
        named.append((union.name, replace(base, drafter=union, draft=draft)))
        # the gate sizes the union's rows by t(n); a member that costs time to ask (heads, a
        # draft model) is still asked, and the replay prices what it measured
        named.append((f"{union.name}+gate", replace(base, drafter=union, draft=draft, gate=AutoGate())))
    kept = []
    for name, candidate in named:
        try:
            verifier = preflight(candidate)
        except DraftwiseError as exc:  # contract, policy and verifier refusals
            skipped.append((name, str(exc)))
            continue
        replayable = spec.generation.policy.greedy or VERIFIERS[verifier]().capabilities.any_candidates
        if candidate.drafter is not None and not replayable:
            # a replay accepts exactly the target's own tokens: what greedy and membership do
            skipped.append((name, f"verifier {verifier!r} accepts by its own rule, which a trace of the target "
                                  "alone cannot replay"))
            continue
        kept.append((name, candidate))
    return kept, skipped


def unions_of(singles: Sequence[DrafterSpec]) -> list[UnionDrafter]:
    """The two-source unions `--proposer auto` also replays: a free-to-ask source (prompt lookup,
    REST) first, merged with each candidate after it (heads included: `prompt-lookup+hydra++`)
    except a self-drafter, which shares the target's state and runs alone."""
    return [UnionDrafter((a, b)) for i, a in enumerate(singles) if a.family.free_to_ask
            for b in singles[i + 1:] if not b.family.drafts_on_target]


def auto_preflight(spec: DecoderSpec) -> str:
    """Refuse what `--proposer auto` cannot combine with, before any model is loaded; return
    the verifiers of the candidates that fit."""
    kept, skipped = candidate_specs(spec, has_draft=False)
    trees = [c for _, c in kept if getattr(c.family_config, "tree", None) is not None]
    if spec.gate is not None or trees:
        raise InputError("--proposer auto tries each proposer with and without the cost gate, draft chains only; "
                         "drop --gate and --tree (or pick the proposer yourself)")
    measured = [f"{key}=auto" for _, c in kept if isinstance(c.family_config, KangarooConfig)
                for key in c.family_config.unresolved]
    if measured:  # a replay on plain traces has no wall time to choose them by
        raise InputError(f"--proposer auto replays fixed configurations; {', '.join(measured)} is chosen by "
                         "--proposer kangaroo (or give a value)")
    if len(kept) <= 1 and skipped:  # plain decoding alone (or nothing) is left: say why the others went
        raise InputError("--proposer auto: no proposer fits; " + "; ".join(f"{n}: {why}" for n, why in skipped))
    return "auto (" + ", ".join(sorted({preflight(c) for _, c in kept})) + ")"


def choose_for_workload(spec: DecoderSpec, target: Backend, draft: Backend | None, workload: str,
                        cache_root: Path) -> ProposerChoice:
    """`choose_proposer` on the first turns of a workload spec (humaneval:0-1, specbench:PATH:N, ...)."""
    from draftwise.workloads import first_turn_prompts

    return choose_proposer(spec, target, draft, first_turn_prompts(target.chat_prompt, workload), cache_root)


def trace_key(target: Backend, prompts: Sequence[Sequence[int]], generation: GenerationConfig) -> dict:
    return {
        "target": target.info.checkpoint,
        "tokenizer_hash": target.info.tokenizer_hash,
        "backend": target.info.name,
        "dtype": target.info.dtype,  # a bfloat16 target's plain traces are another model's
        "threads": getattr(target, "n_threads", None),
        "policy": generation.policy.as_dict(),
        "seed": generation.seed,
        "max_new_tokens": generation.max_new_tokens,
        "stop_strings": list(generation.stop_strings),
        "prompts": stable_hash([list(map(int, p)) for p in prompts]),
    }


def ensure_traces(target: Backend, prompts: Sequence[Sequence[int]], generation: GenerationConfig,
                  directory: Path) -> list[Trace]:
    """Plain traces of `prompts`, decoded now unless a valid cached set for the same key is there."""
    key = trace_key(target, prompts, generation)
    if artifact_matches(directory, TRACES_KIND, lambda p: p == key):
        body = json.loads((directory / TRACES_FILE).read_text())
        return [Trace.from_dict(t) for t in body["traces"]]
    shutil.rmtree(directory, ignore_errors=True)
    decoder = build_decoder(DecoderSpec(drafter=None, generation=generation), target)
    warm = replace(generation, max_new_tokens=min(WARMUP_TOKENS, generation.max_new_tokens))
    build_decoder(DecoderSpec(drafter=None, generation=warm), target).generate(prompts[0])  # untimed: one-time costs
    traces = []
    for i, prompt in enumerate(prompts, 1):
        log.info("plain trace %d/%d (%d new tokens)", i, len(prompts), generation.max_new_tokens)
        result = decoder.generate(prompt)
        seconds = [sum(r.seconds.values()) for r in result.records]  # [rounds], one token each
        traces.append(trace_from_records(prompt, result.tokens, seconds))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TRACES_FILE).write_text(json.dumps({"traces": [t.as_dict() for t in traces]}) + "\n")
    write_manifest(directory, TRACES_KIND, key)
    return traces


def trace_step(traces: Sequence[Trace]) -> float:
    return float(statistics.median(t.step_s for t in traces))


def steps_agree(traces: Sequence[Trace], profile: VerifyCostProfile) -> bool:
    """Whether the traces' plain step and the profile's one-row verify, timed apart (and perhaps
    cached from different hours), agree as they do on an idle machine: they differ only in
    context length and the engine's own bookkeeping per round.  A hand-written profile has no
    times to compare."""
    if profile.absolute_s is None:
        return True
    step, one_row = trace_step(traces), profile.absolute_at(1)
    return one_row / STEP_AGREEMENT <= step <= one_row * STEP_AGREEMENT + ROUND_BOOKKEEPING_S


def agreeing_timings(traces: list[Trace], profile: VerifyCostProfile, retrace: Callable[[], list[Trace]],
                     reprofile: Callable[[], VerifyCostProfile], traces_dir: Path, profile_dir: Path,
                     ) -> tuple[list[Trace], VerifyCostProfile]:
    """Traces and profile whose steps agree (`steps_agree`): where they do not, one of them was
    timed on a busy machine and cached then, so the traces are timed again, then the profile
    (`retrace`, `reprofile`: measure into the emptied directories).  Where they still disagree
    the machine is busy now: said, and the traces are not kept (the profile stays, passed its own
    noise check, for the gate the choice may read)."""
    if not steps_agree(traces, profile):
        log.warning("the plain traces' step (%.1f ms) and the verify profile's one-row step (%.1f ms) disagree: "
                    "the traces are timed again", 1e3 * trace_step(traces), 1e3 * profile.absolute_at(1))
        shutil.rmtree(traces_dir, ignore_errors=True)
        traces = retrace()
    if not steps_agree(traces, profile):
        log.warning("they still disagree (%.1f ms against %.1f ms): the profile is measured again",
                    1e3 * trace_step(traces), 1e3 * profile.absolute_at(1))
        shutil.rmtree(profile_dir, ignore_errors=True)
        profile = reprofile()
    if not steps_agree(traces, profile):
        log.warning("the machine is busy (%.1f ms against %.1f ms): the choice below rests on these timings, and "
                    "the traces are not kept", 1e3 * trace_step(traces), 1e3 * profile.absolute_at(1))
        shutil.rmtree(traces_dir, ignore_errors=True)
    return traces, profile


def choose_proposer(
    spec: DecoderSpec,
    target: Backend,
    draft: Backend | None,
    prompts: Sequence[Sequence[int]],
    cache_root: Path,
    trace_tokens: int | None = None,
    profile_config: AutoTreeConfig = AutoTreeConfig(),
) -> ProposerChoice:
    """Replay every candidate on the calibration traces and pick the fastest predicted.
    The traces run as long as the generation will (`trace_tokens` defaults to its
    max_new_tokens): prompt lookup's misses gather late in a generation, and 64-token traces
    of HumanEval 0-1 ranked ungated lookup first on transformers where 128-token ones, like
    the measured run, rank the gated one first (benchmarks/lookup_grid/)."""
    trace_tokens = trace_tokens or spec.generation.max_new_tokens
    if not prompts:
        raise InputError("--proposer auto needs at least one calibration prompt")
    fitting, _ = candidate_specs(spec, draft is not None)
    spec, unplanned = with_head_trees(spec, target, prompts, cache_root, profile_config,
                                      {name for name, _ in fitting})
    candidates, skipped = candidate_specs(spec, draft is not None)
    skipped = unplanned + skipped
    if not candidates:  # even plain decoding was refused (a heuristic verifier without --allow-heuristic, ...)
        raise InputError("--proposer auto: no candidate fits; " + "; ".join(f"{n}: {why}" for n, why in skipped))
    generation = replace(spec.generation, max_new_tokens=trace_tokens)
    key = trace_key(target, prompts, generation)
    traces_dir = Path(cache_root) / "traces" / stable_hash(key)[:20]
    traces = ensure_traces(target, prompts, generation, traces_dir)
    candidates, built = buildable(candidates, target, draft, skipped)
    hidden = None
    if any(reads_hidden(c) for _, c in candidates):  # draft heads replay on the target's states along the traces
        hidden = HiddenTraces(ensure_hidden(target, traces, key, Path(cache_root) / "trace_hidden" / traces_dir.name),
                              target.info, target.token_weights())  # type: ignore[attr-defined]

    max_rows = max(1 + candidate_rows(c) for _, c in candidates)
    chain = not any(c.drafter is not None and c.drafter.shape.branches for _, c in candidates)
    profile_dir = auto_gate_directory(target, max_rows, cache_root, profile_config, chain)
    profile = ensure_profile(target, profile_dir, gate_rows(max_rows), profile_config.profile_prefix_len,
                             profile_config.profile_repeats, chain=chain)
    traces, profile = agreeing_timings(traces, profile, lambda: ensure_traces(target, prompts, generation, traces_dir),
                                       lambda: ensure_profile(target, profile_dir, gate_rows(max_rows),
                                                              profile_config.profile_prefix_len,
                                                              profile_config.profile_repeats, chain=chain),
                                       traces_dir, profile_dir)

    resolved = [(name, replace(c, gate=GateProfile(profile_dir)) if isinstance(c.gate, AutoGate) else c)  # the gate reads this profile
                for name, c in candidates]
    replays = []
    for (name, candidate), proposers in zip(resolved, built):
        log.info("replaying %s on %d trace(s)", name, len(traces))
        replays.append(replay_candidate(candidate, target, draft, traces, trace_tokens, profile, proposers,
                                        hidden if reads_hidden(candidate) else None))
    plain_rate = replays[0].seconds_per_token  # candidate 0 is plain decoding
    scores = sorted((CandidateScore(name, r.seconds_per_token, plain_rate / r.seconds_per_token, r.mean_accepted,
                                    r.rounds, r.tokens_per_s) for (name, _), r in zip(resolved, replays)),
                    key=lambda c: c.seconds_per_token)  # stable: ties keep plain (listed first) ahead
    chosen = scores[0].name
    chosen_spec = guarded(dict(resolved)[chosen], spec.guard)
    return ProposerChoice(chosen, chosen_spec, tuple(scores), tuple(skipped), traces_dir, profile_dir)


def guarded(chosen: DecoderSpec, asked: Guard) -> DecoderSpec:
    """The chosen configuration behind the do-no-harm guard, unless the user set `guard=` other
    than its default: the replay predicts from calibration prompts, and the guard keeps
    speculating only while the request's own rounds measure faster than plain steps (a prompt
    unlike the calibration set, a busy machine)."""
    if chosen.drafter is None or asked is not Guard.BATCH:
        return chosen
    return replace(chosen, guard=Guard.ON)


@dataclass(frozen=True)
class CandidateReplay:
    seconds: tuple[float, ...]  # [traces] predicted
    tokens: tuple[int, ...]  # [traces]
    accepted: int  # candidates accepted in rounds after the first
    later_rounds: int
    rounds: int

    @property
    def seconds_per_token(self) -> float:
        return sum(self.seconds) / sum(self.tokens)

    @property
    def tokens_per_s(self) -> tuple[float, ...]:
        return tuple(n / s for n, s in zip(self.tokens, self.seconds))

    @property
    def mean_accepted(self) -> float:
        return self.accepted / max(self.later_rounds, 1)


def buildable(candidates: list[tuple[str, DecoderSpec]], target: Backend, draft: Backend | None,
              skipped: list[tuple[str, str]]) -> tuple[list[tuple[str, DecoderSpec]], list[list[Proposer]]]:
    """The candidates whose proposers can be built here, with them (built once: a REST index
    re-checks its checksums on open); the others go to `skipped` with the reason (a self-drafter
    without a skip set or adapter for this target, or on llama.cpp), before they could size the
    verify profile."""
    kept, built = [], []
    for name, candidate in candidates:
        try:
            proposers = make_proposers(candidate, target, draft)
        except DraftwiseError as exc:
            skipped.append((name, str(exc)))
            continue
        kept.append((name, candidate))
        built.append(proposers)
    return kept, built


def replay_candidate(spec: DecoderSpec, target: Backend, draft: Backend | None, traces: Sequence[Trace],
                     trace_tokens: int, profile: VerifyCostProfile,
                     proposers: Sequence[Proposer] | None = None,
                     hidden: "HiddenTraces | None" = None) -> CandidateReplay:
    """Predicted time of one concrete configuration (gate, if any, from `profile`) on `traces`
    (`proposers`: the configuration's, already built; `hidden`: the target's states along the
    traces, for a configuration with draft heads, whose proposers are built per trace on them)."""
    limits = fitted_generation(spec).limits
    gate = CostGateConfig(profile) if spec.gate else None
    if proposers is None and hidden is None:
        proposers = make_proposers(spec, target, draft)  # once: a REST index re-checks its checksums on open
    seconds, tokens = [], []
    accepted = later_rounds = rounds_total = 0
    for i, trace in enumerate(traces):
        stand_in = None if hidden is None else hidden.backend(i, trace, trace_tokens)
        rounds = replay(trace, proposers if stand_in is None else make_proposers(spec, stand_in, draft),
                        max_new_tokens=trace_tokens, limits=limits, context_length=target.info.context_length,
                        gate=gate, policy=spec.generation.policy, seed=spec.generation.seed, target=stand_in)
        seconds.append(predicted_seconds(trace, rounds, profile))
        tokens.append(len(trace.tokens))
        accepted += sum(r.accepted for r in rounds[1:])
        later_rounds += len(rounds) - 1
        rounds_total += len(rounds)
    return CandidateReplay(tuple(seconds), tuple(tokens), accepted, later_rounds, rounds_total)


def candidate_rows(spec: DecoderSpec) -> int:
    """Candidate rows one round of `spec` can verify (REST: the tree limit, its tries vary)."""
    if spec.drafter is None:
        return 0
    nodes, _ = proposal_shape(spec)
    limits = fitted_generation(spec).limits
    return min(nodes, limits.max_nodes) if nodes else limits.max_nodes



def reads_hidden(spec: DecoderSpec) -> bool:
    return any(m.family.reads_hidden for m in members_of(spec))


def members_of(spec: DecoderSpec) -> tuple[DrafterSpec, ...]:
    drafter = spec.drafter
    if drafter is None or isinstance(drafter, AutoDrafter):
        return ()
    return drafter.members if isinstance(drafter, UnionDrafter) else (drafter,)


@dataclass(frozen=True, eq=False)
class HiddenTraces:
    """The target's states along each trace, and what a trace backend serving them needs of it."""

    states: Sequence[TraceHidden]  # [traces]
    target: BackendInfo
    weights: TokenWeights  # the target's embedding and LM head, which heads read

    def backend(self, i: int, trace: Trace, trace_tokens: int) -> HiddenTraceBackend:
        recorded = self.states[i]
        return HiddenTraceBackend(trace.prompt, trace.tokens, self.target.context_length,
                                  trace_eos(trace, trace_tokens), target=self.target, hidden=recorded.states,
                                  first=recorded.first, weights=self.weights)


def with_head_trees(spec: DecoderSpec, target: Backend, prompts: Sequence[Sequence[int]], cache_root: Path,
                    config: AutoTreeConfig, fitting: set[str]) -> tuple[DecoderSpec, list[tuple[str, str]]]:
    """`spec` whose head-family candidates (those in `fitting`, which passed the preflight) carry
    the tree `--proposer FAMILY --tree auto` decodes with: calibrated on the same prompts,
    profiled and optimized, cached and shared with it; so the replay times the tree the family
    would really run.  A family whose heads do not ship for this target or run on this backend,
    or whose best tree is no tree at all, is dropped and listed with the reason."""
    from draftwise.optimize.auto import auto_head_tree

    assert isinstance(spec.drafter, AutoDrafter)
    kept: list[DrafterSpec] = []
    skipped: list[tuple[str, str]] = []
    for drafter in spec.drafter.candidates:
        family = drafter.family
        if not (family.reads_hidden and family.auto_tree and family.name in fitting):
            kept.append(drafter)
            continue
        # the candidate keeps its own relation (top-k by default): under sampling its children are
        # then verified by membership, which a trace replays (without-replacement draws are not)
        alone = replace(spec, drafter=drafter, gate=None, draft=None)
        try:
            make_proposers(alone, target)  # the heads ship for this target, and this backend runs them
            artifact = auto_head_tree(alone, target, prompts, cache_root, config)
        except DraftwiseError as exc:
            skipped.append((family.name, str(exc)))
            continue
        picked = artifact.choice
        if picked.n == 1:
            skipped.append((family.name, f"tree=auto chose no tree here (predicted {picked.speedup:.2f}x plain)"))
            continue
        tree = TreeTemplate(from_paths(picked.paths))
        kept.append(replace(drafter, config=replace(drafter.config, tree=tree)))
    return replace(spec, drafter=replace(spec.drafter, candidates=tuple(kept))), skipped
