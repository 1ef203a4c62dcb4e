"""Planning: every `auto` of a spec turned into a concrete, recorded choice.

The middle stage of `open_decoder`'s one pass down (parse -> plan -> build).  `plan` checks
the spec before anything is loaded (`check`), loads the backends, and settles what was left
to measurement (`resolve`), handing `draftwise.build` a `Plan`.  Four things may be left to
measurement: the proposer (`AutoDrafter`: replay every candidate on plain traces), a draft
tree (`AutoTree`: calibrate, profile and optimize, cached), Kangaroo's early exit and exit
layer (`eta=auto`, `adapter=auto`: decode each candidate and time it, cached), and the cost
gate (`AutoGate`: the target's verify profile, cached).  A fifth, the transformers dtype, is
measured by the loader (it decides which weights to load) and only recorded here.  A tree
artifact is read here too, so that `build` only ever sees templates.  This module calls the
planning tools in `draftwise.optimize` and the stages below them; nothing below calls it.
"""

from __future__ import annotations

import logging

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, cast

from draftwise.backends.base import Backend
from draftwise.backends.dtype import DtypeChoice
from draftwise.measure import auto_cache_root
from draftwise.measure.load import Loader, default_loader
from draftwise.build import Plan
from draftwise.errors import InputError
from draftwise.preflight import preflight
from draftwise.proposers.kangaroo import AutoAdapter, AutoEta, KangarooConfig
from draftwise.spec import (CALIBRATION_WORKLOAD, AutoDrafter, AutoGate, Choice, DecoderSpec, DrafterSpec, GateProfile,
                            UnionDrafter, fitted_generation, proposal_shape)
from draftwise.topology.templates import from_paths
from draftwise.topology.tree_spec import AutoTree, TreeArtifact, TreeTemplate
from draftwise.workloads import first_turn_prompts

if TYPE_CHECKING:
    from draftwise.optimize.kangaroo_tune import Measure

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

def plan(spec: DecoderSpec, loader: Loader | None = None, calibration: str = CALIBRATION_WORKLOAD,
         cache_root: Path | None = None) -> Plan:
    """Check `spec`, load its backends (`loader`: by default `load_backend` with the spec's
    threads, device, dtype and strict scope) and resolve every `auto`: what `build` builds."""
    check(spec)
    load = loader or default_loader(spec.threads, spec.device, spec.dtype, spec.strict_scope)
    target = load(spec.target, spec.backend, "target")
    draft = load(spec.draft, spec.backend, "draft") if spec.draft and spec.uses_draft_model else None
    resolved, choices = resolve(spec, target, draft, cache_root=cache_root, calibration=calibration)
    return Plan(resolved, spec, target, draft, choices)


# ---- before loading ------------------------------------------------------------------------
def check(spec: DecoderSpec) -> str:
    """Refuse what cannot work before any model is loaded; return the verifier's name (for
    `auto`, the verifiers of the candidates that fit)."""
    if isinstance(spec.drafter, AutoDrafter):
        from draftwise.optimize.auto_proposer import auto_preflight

        return auto_preflight(spec)
    if isinstance(spec.drafter, UnionDrafter):
        for member in spec.drafter.members:  # a member's planned tree is planned as for the member alone
            if isinstance(_tree_of(member), AutoTree):
                check(replace(spec, drafter=member, gate=None))
    spec = with_auto_tree_relation(spec)
    tree = _tree_of(spec.drafter)
    if isinstance(tree, AutoTree):
        assert isinstance(spec.drafter, DrafterSpec)
        if not spec.drafter.family.auto_tree:
            raise InputError(f"tree=auto is planned for {', '.join(_auto_tree_families())}, not {spec.proposer}")
        if spec.drafter.family.needs_draft_model and not spec.draft:
            raise InputError(f"--tree auto chooses a {spec.proposer} tree: pass --draft MODEL")
    return preflight(spec)


def with_auto_tree_relation(spec: DecoderSpec) -> DecoderSpec:
    """An auto tree's children are top-k under greedy decoding and drawn without replacement
    when sampling (verified by Sequoia): the relation is the planner's, not the user's."""
    from draftwise.optimize.calibrate import relation_for

    if isinstance(spec.drafter, DrafterSpec) and isinstance(_tree_of(spec.drafter), AutoTree):
        config = replace(spec.drafter.config, relation=relation_for(spec.generation.policy))
        return replace(spec, drafter=replace(spec.drafter, config=config))
    return spec


def _tree_of(drafter: object) -> object:
    return getattr(getattr(drafter, "config", None), "tree", None)


def _auto_tree_families() -> list[str]:
    from draftwise.proposers.registry import DRAFTERS

    return [f.name for f in DRAFTERS.families() if f.auto_tree]


# ---- after loading -------------------------------------------------------------------------
def resolve(spec: DecoderSpec, target: Backend, draft: Backend | None = None,
            cache_root: Path | None = None, calibration: str = CALIBRATION_WORKLOAD,
            ) -> tuple[DecoderSpec, tuple[Choice, ...]]:
    """`spec` with every `auto` chosen and every tree artifact read, and the choices made.
    `calibration`: the workload an auto tree is calibrated on (an auto proposer names its own)."""
    root = cache_root or auto_cache_root()
    choices: list[Choice] = []
    if spec.dtype == "auto":  # settled when the backends were loaded: recorded here
        spec = _record_dtype(spec, target, draft, choices)
    if isinstance(spec.drafter, AutoDrafter):
        spec = _resolve_proposer(spec, target, draft, root, choices)
    if isinstance(spec.drafter, UnionDrafter):
        spec = _resolve_member_trees(spec, target, draft, first_turn_prompts(target.chat_prompt, calibration), root,
                                     choices)
    spec = with_auto_tree_relation(spec)
    tree = _tree_of(spec.drafter)
    if isinstance(tree, AutoTree):
        spec = _resolve_auto_tree(spec, target, draft, first_turn_prompts(target.chat_prompt, calibration), root, choices)
    elif isinstance(tree, TreeArtifact):
        spec = _with_template(spec, read_tree_artifact(tree, spec))
    if isinstance(spec.family_config, KangarooConfig) and spec.family_config.unresolved:
        spec, settled = resolve_kangaroo(spec, target, first_turn_prompts(target.chat_prompt, calibration), root)
        choices.extend(settled)
    if isinstance(spec.gate, AutoGate):
        batches = _measure_batch_gate(spec, target, root) if spec.max_batch > 1 else None
        spec = replace(spec, gate=GateProfile(_measure_gate(spec, target, root), batches))
        choices.append(Choice("gate", str(spec.gate), "verify profile measured on first use, cached"
                              + (f"; batch profile for up to {spec.max_batch} requests: {batches}" if batches else "")))
    return spec, tuple(choices)


def _record_dtype(spec: DecoderSpec, target: Backend, draft: Backend | None, choices: list[Choice]) -> DecoderSpec:
    """`dtype auto` became the dtype the target was loaded in (the loader measured it, see
    `draftwise.measure.dtype`); the choice is recorded with the measurement it came from."""
    from draftwise.backends.dtype import CONCRETE_DTYPES
    from draftwise.measure.dtype import recorded_decision

    if target.info.dtype not in CONCRETE_DTYPES:
        raise InputError(f"dtype auto chooses the transformers backend's dtype; the {target.info.name} target "
                         f"computes in {target.info.dtype}")
    details = []
    for role, backend in (("target", target), ("draft", draft)):
        if backend is not None:
            decision = recorded_decision(backend.info.checkpoint, backend.n_threads, backend.info.device)
            details.append(f"{role} {backend.info.checkpoint}: {backend.info.dtype}"
                           + (f" ({decision.describe()})" if decision is not None else ""))
    choices.append(Choice("dtype", target.info.dtype, "; ".join(details)))
    return replace(spec, dtype=cast(DtypeChoice, target.info.dtype))  # a concrete dtype, checked above


def _resolve_proposer(spec: DecoderSpec, target: Backend, draft: Backend | None, root: Path,
                      choices: list[Choice]) -> DecoderSpec:
    from draftwise.optimize.auto_proposer import choose_for_workload

    assert isinstance(spec.drafter, AutoDrafter)
    choice = choose_for_workload(spec, target, draft, spec.drafter.calibration, root)
    for line in choice.table().splitlines():
        log.info(line)
    choices.append(Choice("proposer", choice.chosen, choice.table()))
    return choice.spec


def _resolve_auto_tree(spec: DecoderSpec, target: Backend, draft: Backend | None, prompts: list[list[int]],
                       root: Path, choices: list[Choice], what: str = "tree") -> DecoderSpec:
    from draftwise.optimize.auto import auto_head_tree, auto_tree

    assert isinstance(spec.drafter, DrafterSpec)
    if not spec.drafter.family.needs_draft_model:  # a head family: its own heads, the target's t(n)
        artifact = auto_head_tree(spec, target, prompts, root)
    elif draft is None:
        raise InputError(f"--tree auto chooses a {spec.proposer} tree: pass --draft MODEL")
    else:
        artifact = auto_tree(target, draft, spec.generation.policy, prompts, root)
    picked = artifact.choice
    log.info("auto tree: n=%d d=%d, predicted speedup %.2f", picked.n, picked.d, picked.speedup)
    if picked.n == 1:  # measured: no tree beats plain decoding here
        choices.append(Choice(what, "none (plain decoding)", f"predicted speedup {picked.speedup:.3f}"))
        return replace(spec, drafter=None)
    choices.append(Choice(what, str(artifact.directory), f"n={picked.n} d={picked.d}, "
                                                           f"predicted speedup {picked.speedup:.3f}"))
    return _with_template(spec, TreeTemplate(from_paths(picked.paths)))


def _resolve_member_trees(spec: DecoderSpec, target: Backend, draft: Backend | None, prompts: list[list[int]],
                          root: Path, choices: list[Choice]) -> DecoderSpec:
    """A union whose members' planned trees (`tree=auto`, a `tree optimize` artifact) are planned
    or read as for each member alone (the same cached artifacts), so `prompt-lookup+hydra++
    --set tree=auto` merges lookup with the heads' best tree.  A member whose best tree is no
    tree proposes nothing worth a row: it leaves the union (a union left with one member is that
    member).  Each member keeps its own children relation: the union's verifier was negotiated
    for it."""
    assert isinstance(spec.drafter, UnionDrafter)
    kept: list[DrafterSpec] = []
    for member in spec.drafter.members:
        tree = _tree_of(member)
        alone = replace(spec, drafter=member, gate=None)
        if isinstance(tree, AutoTree):
            alone = _resolve_auto_tree(alone, target, draft, prompts, root, choices, what=f"tree of {member.name}")
        elif isinstance(tree, TreeArtifact):
            alone = _with_template(alone, read_tree_artifact(tree, alone))
        if alone.drafter is not None:
            assert isinstance(alone.drafter, DrafterSpec)
            kept.append(alone.drafter)
    drafter = UnionDrafter(tuple(kept)) if len(kept) > 1 else kept[0]
    return replace(spec, drafter=drafter)


def resolve_kangaroo(spec: DecoderSpec, target: Backend, prompts: Sequence[Sequence[int]], root: Path,
                     measure: Measure | None = None) -> tuple[DecoderSpec, tuple[Choice, ...]]:
    """Kangaroo's `eta=auto` / `adapter=auto` settled by measured time per committed token on
    `prompts` (cached under `root`), and the choices made; plain decoding when it measured faster
    than every candidate.  `measure`: how a candidate is timed (default: by decoding it)."""
    from draftwise.optimize.kangaroo_auto import auto_kangaroo
    from draftwise.optimize.skip_search import seconds_per_token

    config = spec.family_config
    assert isinstance(spec.drafter, DrafterSpec) and isinstance(config, KangarooConfig)
    picked = auto_kangaroo(target, config, spec.generation.policy, spec.verifier, prompts, root,
                           measure=measure or seconds_per_token)
    table = picked.describe()
    for line in table.splitlines():
        log.info("kangaroo auto: %s", line)
    if picked.plain_wins:  # measured: no adapter and eta beat plain decoding here
        # the gate, if any, goes too: it cuts proposals, and plain decoding makes none
        what = "eta" if isinstance(config.eta, AutoEta) else "adapter"
        return replace(spec, drafter=None, gate=None), (Choice(what, "none (plain decoding)", table),)
    assert picked.adapter is not None and picked.eta is not None
    choices = []
    if isinstance(config.adapter, AutoAdapter):
        choices.append(Choice("adapter", str(picked.adapter), table))
    if isinstance(config.eta, AutoEta):
        choices.append(Choice("eta", f"{picked.eta:g}", table))
    chosen = replace(config, adapter=str(picked.adapter), eta=picked.eta)
    return replace(spec, drafter=replace(spec.drafter, config=chosen)), tuple(choices)


def read_tree_artifact(tree: TreeArtifact, spec: DecoderSpec) -> TreeTemplate:
    """A `tree optimize` artifact's paths, used only under the sampling policy it was optimized for."""
    from draftwise.optimize.select import load_tree_artifact

    artifact = load_tree_artifact(tree.directory)
    wanted = spec.generation.policy.as_dict()
    if dict(artifact.policy) != wanted:
        raise InputError(f"tree {tree} was optimized under sampling policy {dict(artifact.policy)}, not {wanted}; "
                         "calibrate and optimize again for this policy")
    return TreeTemplate(from_paths(artifact.choice.paths))


def _with_template(spec: DecoderSpec, template: TreeTemplate) -> DecoderSpec:
    assert isinstance(spec.drafter, DrafterSpec)
    return replace(spec, drafter=replace(spec.drafter, config=replace(spec.drafter.config, tree=template)))


def gate_rows_needed(spec: DecoderSpec) -> int:
    """The most rows a round of this (concrete) configuration verifies, the pending one included."""
    nodes, _ = proposal_shape(spec)  # (0, 0) when unknown in advance: the tree limit bounds it
    limit = fitted_generation(spec).limits.max_nodes
    return 1 + (min(nodes, limit) if nodes else limit)


def branches(spec: DecoderSpec) -> bool:
    return isinstance(spec.drafter, (DrafterSpec, UnionDrafter)) and spec.drafter.shape.branches


def _measure_gate(spec: DecoderSpec, target: Backend, root: Path) -> Path:
    from draftwise.optimize.auto import auto_gate_directory, auto_gate_profile

    # a strict llama.cpp target verifies no more rows than its probe measured exact
    rows, chain = min(gate_rows_needed(spec), target.info.max_verify_rows), not branches(spec)
    auto_gate_profile(target, rows, root, chain=chain)
    return auto_gate_directory(target, rows, root, chain=chain)


def _measure_batch_gate(spec: DecoderSpec, target: Backend, root: Path) -> Path:
    from draftwise.optimize.auto import auto_batch_gate_profile

    # chains of n - 1 rows per request price a tree of n rows too (both one 4D-masked forward)
    return auto_batch_gate_profile(target, spec.max_batch, min(gate_rows_needed(spec), target.info.max_verify_rows), root)
