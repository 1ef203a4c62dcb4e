"""Typed specs of a decoding configuration: what every stage below the edge reads.

`DecoderSpec` names a configuration; every field is typed: the drafter is a registered
family with its config (`DrafterSpec`), `AutoDrafter` or None (plain decoding); the gate an
`AutoGate`, a `GateProfile` or None; a draft-model tree a `TreeSpec`.  Strings become a spec
once, at the edge (`draftwise.parse`); every `auto` becomes a concrete, recorded `Choice` in
`draftwise.plan`; `draftwise.build` builds only concrete specs.  This module parses nothing
but its own enum words and imports none of those stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice, check_dtype
from draftwise.backends.load import BACKENDS
from draftwise.runtime.contracts import ProposerContract
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError
from draftwise.models import DEFAULT_MODEL
from draftwise.options import config_items
from draftwise.runtime.guard import DoNoHarmConfig
from draftwise.proposers.family import CandidateShape, DrafterFamily
from draftwise.proposers.registry import DRAFTERS
from draftwise.topology.compile import TreeLimits

if TYPE_CHECKING:
    from draftwise.backends.base import StrictScope

# the prompts `--proposer auto` and `--tree auto` calibrate on: code and everyday chat, neither in a
# benchmark workload (calibrating on code alone ranked prompt lookup above its unions with heads,
# which win on prose: benchmarks/heterogeneous/)
CALIBRATION_WORKLOAD = "humaneval:0-1+chat-calibration"


@dataclass(frozen=True)
class DrafterSpec:
    """One registered family with its typed config."""

    family: DrafterFamily[Any]
    config: Any

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def contract(self) -> ProposerContract:
        return self.family.contract(self.config)

    @property
    def shape(self) -> CandidateShape:
        return self.family.shape(self.config)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in config_items(self.config).items())


@dataclass(frozen=True)
class UnionDrafter:
    """`--proposer prompt-lookup+hydra`: several registered families propose in every round.
    The compiler merges their candidates by full prefix into one tree (each row keeps the source
    that proposed it first, `CompiledRound.source_id`), and one verifier that every member's
    contract satisfies checks it: greedy at temperature 0, target-sample membership when
    sampling (a residual verifier needs one proposal distribution per row; merged rows have up
    to one per source, so unions are never given one)."""

    members: tuple[DrafterSpec, ...]  # >= 2 distinct families, in the order they propose

    def __post_init__(self) -> None:
        names = [m.name for m in self.members]
        if len(names) < 2 or len(set(names)) != len(names):
            raise InputError(f"a union of proposers names two or more distinct families, got {'+'.join(names)}")

    @property
    def name(self) -> str:
        return UNION_SEPARATOR.join(m.name for m in self.members)

    @property
    def shape(self) -> CandidateShape:
        """Every member's rows (merged rows only make it fewer); a merge of two sources branches."""
        shapes = [m.shape for m in self.members]
        rows = 0 if any(s.rows == 0 for s in shapes) else sum(s.rows for s in shapes)
        depth = 0 if any(s.depth == 0 for s in shapes) else max(s.depth for s in shapes)
        return CandidateShape(rows, depth, branches=True)

    @property
    def contracts(self) -> tuple[ProposerContract, ...]:
        return tuple(m.contract for m in self.members)

    @property
    def needs_draft_model(self) -> bool:
        return any(m.family.needs_draft_model for m in self.members)

    def describe(self) -> str:
        return "; ".join(f"{m.name}: {m.describe()}" for m in self.members)


UNION_SEPARATOR = "+"


@dataclass(frozen=True)
class AutoDrafter:
    """`--proposer auto`: the candidates are these families' configs (the user's settings carried
    into each), plain decoding, and the free ones behind a cost gate."""

    candidates: tuple[DrafterSpec, ...]
    calibration: str = CALIBRATION_WORKLOAD  # the workload its plain traces come from
    name: str = field(default="auto", init=False)


@dataclass(frozen=True)
class AutoGate:
    """The target's verify profile over every row count a round can verify, measured on first use."""

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class GateProfile:
    directory: Path  # a verify_profile artifact (`draftwise profile --out DIR`)
    batches: Path | None = None  # a batch_verify_profile artifact: t_B(n) for batched decoding

    def __str__(self) -> str:
        return str(self.directory)


@dataclass(frozen=True)
class Choice:
    """One `auto` settled: what was asked, what was chosen, and the evidence (table or artifact)."""

    what: str  # "proposer", "tree", "adapter", "eta", "gate" or "dtype"
    chosen: str
    detail: str = ""


GatePolicy = AutoGate | GateProfile
Drafter = DrafterSpec | UnionDrafter | AutoDrafter
ConcreteDrafter = DrafterSpec | UnionDrafter


def members(drafter: Drafter | None) -> tuple[DrafterSpec, ...]:
    """The families that propose in each round: none, one, or a union's members in order."""
    if drafter is None:
        return ()
    if isinstance(drafter, AutoDrafter):
        raise InputError("proposer auto is chosen after loading: plan the spec first (draftwise.open_decoder does)")
    return drafter.members if isinstance(drafter, UnionDrafter) else (drafter,)


def default_drafter() -> DrafterSpec:
    family = DRAFTERS.get("prompt-lookup")
    return DrafterSpec(family, family.config())


class Strict(Enum):
    """llama.cpp's bit-exact kernels (`strict=`): which shapes of verify rows must equal plain
    decoding's rows bit for bit (`backends.llamacpp.STRICT_CHAIN_KERNELS` / `STRICT_TREE_KERNELS`)."""

    OFF = "false"
    AUTO = "true"  # chains when the drafter never branches (and for plain decoding), else trees
    CHAINS = "chains"  # flash attention off: verifies cost what they cost by default; trees refused
    TREES = "trees"  # flash attention on: chains and trees, multi-row verifies slower

    @classmethod
    def parse(cls, word: str) -> "Strict":
        aliases = {"1": cls.AUTO, "yes": cls.AUTO, "0": cls.OFF, "no": cls.OFF}
        try:
            return aliases.get(word.lower()) or cls(word.lower())
        except ValueError:
            raise InputError(f"strict={word!r}: choose true, false, chains or trees") from None


class Guard(Enum):
    """The do-no-harm guard (`guard=`, `draftwise.runtime.guard`): where each round may fall back
    to a plain step because plain steps measured more committed tokens per second."""

    # batches only (the default), and a request whose proposer `auto` chose (`optimize.auto_proposer.guarded`):
    # a shared forward's rows compete with other requests', and a replay predicts from other prompts
    BATCH = "batch"
    ON = "true"  # single requests too: a request's own rounds, with a small exploration budget
    OFF = "false"  # speculate in every round

    @classmethod
    def parse(cls, word: str) -> "Guard":
        aliases = {"1": cls.ON, "yes": cls.ON, "on": cls.ON, "0": cls.OFF, "no": cls.OFF, "off": cls.OFF}
        try:
            return aliases.get(word.lower()) or cls(word.lower())
        except ValueError:
            raise InputError(f"guard={word!r}: choose batch (the default), true or false") from None


@dataclass(frozen=True)
class DecoderSpec:
    """Everything that names one decoding configuration."""

    target: str = DEFAULT_MODEL
    backend: str = "auto"
    drafter: Drafter | None = field(default_factory=default_drafter)  # None: plain decoding
    draft: str | None = None  # draft model, for families that need one
    verifier: str = "auto"
    gate: GatePolicy | None = None
    threads: int | None = None
    device: str = "cpu"
    dtype: DtypeChoice = DEFAULT_DTYPE  # the transformers backend's: float32, bfloat16 or auto (measured)
    strict: Strict = Strict.OFF  # llama.cpp: kernels whose verify rows equal plain decoding's bit for bit
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    max_batch: int = 1  # requests a batch decoder of this spec holds at once (`batch=`): the gate is planned for it
    # each round speculates or decodes plainly by which the rounds measured to commit more tokens per
    # second (`draftwise.runtime.guard`): in batches (the default), everywhere (true) or nowhere (false)
    guard: Guard = Guard.BATCH

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        check_dtype(self.dtype)
        if self.max_batch < 1:
            raise InputError(f"batch={self.max_batch}: a batch holds at least 1 request")
        if self.strict is not Strict.OFF and self.backend == "transformers":
            raise InputError("strict chooses the llama.cpp backend's kernels (bit-identical verify rows); the "
                             "transformers backend has no such setting: `draftwise profile --invariance` measures its rows")
        if self.strict is Strict.CHAINS and self._branches:
            raise InputError(f"strict=chains verifies chains bit-exactly, and proposer {self.proposer} may propose a "
                             "tree: use strict=true (chooses trees for it) or strict=trees")

    @property
    def _branches(self) -> bool:
        """Whether a round may hold a tree: a family whose shape branches, or auto (any candidate)."""
        if isinstance(self.drafter, (DrafterSpec, UnionDrafter)):
            return self.drafter.shape.branches
        return self.drafter is not None

    @property
    def strict_scope(self) -> StrictScope | None:
        """The shapes a strict target must verify bit-exactly (None: not strict)."""
        if self.strict is Strict.OFF:
            return None
        if self.strict is Strict.AUTO:
            return "trees" if self._branches else "chains"
        return "chains" if self.strict is Strict.CHAINS else "trees"

    @property
    def proposer(self) -> str:
        """The drafter's name: none, a family, or auto."""
        return "none" if self.drafter is None else self.drafter.name

    @property
    def uses_draft_model(self) -> bool:
        """Whether a draft model is loaded: for a family that drafts with one, or for auto (its candidate)."""
        if isinstance(self.drafter, DrafterSpec):
            return self.drafter.family.needs_draft_model
        if isinstance(self.drafter, UnionDrafter):
            return self.drafter.needs_draft_model
        return self.drafter is not None

    @property
    def family_config(self) -> Any:
        """The concrete drafter's config (None for plain decoding or auto)."""
        return self.drafter.config if isinstance(self.drafter, DrafterSpec) else None

    def plain(self) -> "DecoderSpec":
        """The same target, backend and generation, decoding without proposals."""
        return replace(self, drafter=None, verifier="auto", gate=None)

    def describe(self) -> str:
        parts = [f"proposer={self.proposer}", f"backend={self.backend}", f"verifier={self.verifier}",
                 f"target={self.target}"]
        if isinstance(self.drafter, (DrafterSpec, UnionDrafter)):
            if self.uses_draft_model:
                parts.append(f"draft={self.draft}")
            parts.append(self.drafter.describe())
        if self.gate is not None:
            parts.append(f"gate={self.gate}")
        if self.dtype != DEFAULT_DTYPE:  # said only when set: a llama.cpp method's description is unchanged
            parts.append(f"dtype={self.dtype}")
        if self.strict is not Strict.OFF:
            parts.append(f"strict={self.strict.value}")
        if self.max_batch > 1:
            parts.append(f"batch={self.max_batch}")
        if self.guard is not Guard.BATCH:
            parts.append(f"guard={self.guard.value}")
        if not self.generation.exact:
            parts.append("exact=false (HEURISTIC verifier allowed: outputs are not the target's distribution)")
        return ", ".join(p for p in parts if p)


def concrete_drafter(spec: DecoderSpec) -> ConcreteDrafter | None:
    """The spec's drafter, refused while it is still `auto` (chosen after loading, by `draftwise.plan`)."""
    if isinstance(spec.drafter, AutoDrafter):
        raise InputError("proposer auto is chosen after loading: plan the spec first (draftwise.open_decoder does)")
    return spec.drafter


def proposal_shape(spec: DecoderSpec) -> tuple[int, int]:
    """(nodes, depth) the configured proposer can produce in one round; (0, 0) when unknown in
    advance (bounded by the tree limits)."""
    drafter = concrete_drafter(spec)
    if drafter is None:
        return 0, 0
    shape = drafter.shape
    return shape.rows, shape.depth


def guarded_alone(spec: DecoderSpec) -> bool:
    """Whether a request decoded alone runs behind the do-no-harm guard: `guard=true`, or, under
    the default, a union with a source that runs a model (heads, a draft model).  Its proposal is
    paid every round whatever the gate keeps of its rows, and the gate prices rows only: on
    llama.cpp, where a head forward is a large share of a plain step, a gated prompt-lookup+hydra++
    ran below plain decoding (benchmarks/heads_training/).  The guard asks no proposer in its plain
    rounds."""
    if spec.guard is not Guard.BATCH:
        return spec.guard is Guard.ON
    return isinstance(spec.drafter, UnionDrafter) and any(not m.family.free_to_ask for m in spec.drafter.members)


def fitted_generation(spec: DecoderSpec) -> GenerationConfig:
    """The generation config with tree limits raised to the proposer's configured shape.
    A draft whose tail the compiler cuts is paid for and never verified: a k = 20 chain under
    the 16-deep default verified 17 tokens per round where transformers verifies 21."""
    nodes, depth = proposal_shape(spec)
    limits = spec.generation.limits
    generation = replace(spec.generation, guard=DoNoHarmConfig()) if guarded_alone(spec) else spec.generation
    if nodes <= limits.max_nodes and depth <= limits.max_depth:
        return generation
    return replace(generation, limits=TreeLimits(max(limits.max_nodes, nodes), max(limits.max_depth, depth)))
