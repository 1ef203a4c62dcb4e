"""Typed specs of a decoding configuration, and their one parser from `KEY=VALUE` strings.

`DecoderSpec` names a configuration; every field is typed: the drafter is a registered
family with its config (`DrafterSpec`), `AutoDrafter` or None (plain decoding); the gate an
`AutoGate`, a `GateProfile` or None; a draft-model tree a `TreeSpec`.  `spec_from_options`
reads the same keys wherever they come from (the CLI's options and `--set`, a bench method
string, a TOML or JSON file), so a configuration means the same thing everywhere.  Every
`auto` is turned into a concrete, recorded choice by `draftwise.resolve`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, cast

from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice, check_dtype
from draftwise.contracts import ProposerContract
from draftwise.engine import GenerationConfig
from draftwise.errors import InputError
from draftwise.models import DEFAULT_MODEL
from draftwise.options import config_items, config_keys, parse_config
from draftwise.proposers.family import CandidateShape, DrafterFamily, DrafterRegistry
from draftwise.proposers.registry import DRAFTERS
from draftwise.topology.compile import TreeLimits

if TYPE_CHECKING:
    from draftwise.backends.invariance import StrictScope

BACKENDS = ("auto", "transformers", "llamacpp")
CALIBRATION_WORKLOAD = "humaneval:0-1"  # the prompts `--proposer auto` and `--tree auto` calibrate on


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

    def __str__(self) -> str:
        return str(self.directory)


GatePolicy = AutoGate | GateProfile
Drafter = DrafterSpec | AutoDrafter


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

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        check_dtype(self.dtype)
        if self.strict is not Strict.OFF and self.backend == "transformers":
            raise InputError("strict chooses the llama.cpp backend's kernels (bit-identical verify rows); the "
                             "transformers backend has no such setting: `draftwise profile --invariance` measures its rows")
        if self.strict is Strict.CHAINS and self._branches:
            raise InputError(f"strict=chains verifies chains bit-exactly, and proposer {self.proposer} may propose a "
                             "tree: use strict=true (chooses trees for it) or strict=trees")

    @property
    def _branches(self) -> bool:
        """Whether a round may hold a tree: a family whose shape branches, or auto (any candidate)."""
        if isinstance(self.drafter, DrafterSpec):
            return self.drafter.family.shape(self.drafter.config).branches
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
        if isinstance(self.drafter, DrafterSpec):
            if self.drafter.family.needs_draft_model:
                parts.append(f"draft={self.draft}")
            parts.append(self.drafter.describe())
        if self.gate is not None:
            parts.append(f"gate={self.gate}")
        if self.dtype != DEFAULT_DTYPE:  # said only when set: a llama.cpp method's description is unchanged
            parts.append(f"dtype={self.dtype}")
        if self.strict is not Strict.OFF:
            parts.append(f"strict={self.strict.value}")
        if not self.generation.exact:
            parts.append("exact=false (HEURISTIC verifier allowed: outputs are not the target's distribution)")
        return ", ".join(p for p in parts if p)


def drafter_keys(registry: DrafterRegistry = DRAFTERS) -> set[str]:
    return {key for family in registry.families() for key in config_keys(family.config)}


DECODER_KEYS = frozenset({"proposer", "backend", "verifier", "target", "draft", "gate", "max_nodes", "max_depth",
                          "exact", "calibration", "dtype", "strict"})


def parse_drafter(name: str, values: Mapping[str, str], registry: DrafterRegistry = DRAFTERS,
                  calibration: str | None = None) -> Drafter | None:
    """The drafter named `name` with its config keys parsed from `values` (the keys of other
    families are refused: silently ignoring one would run a configuration nobody asked for)."""
    if name == "none":
        _refuse_keys(values, "proposer none takes no drafter keys")
        return None
    if name == "auto":
        return _parse_auto(values, registry, calibration)
    family = registry.get(name)
    own = set(config_keys(family.config))
    foreign = sorted(set(values) - own)
    if foreign:
        owners = {k: [f.name for f in registry.families() if k in config_keys(f.config)] for k in foreign}
        said = "; ".join(f"{k} configures {', '.join(o) or 'nothing'}" for k, o in owners.items())
        raise InputError(f"proposer {name}: {said}, not {name}; its keys: {', '.join(sorted(own)) or 'none'}")
    return DrafterSpec(family, parse_config(family.config, values, f"proposer {name}"))


def _parse_auto(values: Mapping[str, str], registry: DrafterRegistry, calibration: str | None) -> AutoDrafter:
    unknown = sorted(set(values) - drafter_keys(registry))
    if unknown:
        raise InputError(f"proposer auto: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(drafter_keys(registry)))}")
    candidates = []
    for family in registry.families():
        if not family.auto_candidate:
            continue
        own = {k: v for k, v in values.items() if k in config_keys(family.config)}
        required = [k for k, f in config_keys(family.config).items() if f.default is dataclasses.MISSING]
        if any(k not in own for k in required):
            continue  # e.g. REST without an index: not a candidate
        candidates.append(DrafterSpec(family, parse_config(family.config, own, f"proposer auto ({family.name})")))
    return AutoDrafter(tuple(candidates), calibration or CALIBRATION_WORKLOAD)


def _refuse_keys(values: Mapping[str, str], why: str) -> None:
    if values:
        raise InputError(f"{', '.join(sorted(values))}: {why}")


def parse_gate(text: str | None) -> GatePolicy | None:
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    if text.strip() == "auto":
        return AutoGate()
    if not Path(text).is_dir():
        raise InputError(f"gate must be auto or a verify_profile directory (draftwise profile --out DIR); "
                         f"{text!r} is neither")
    return GateProfile(Path(text))


def int_value(values: Mapping[str, str], key: str, default: int) -> int:
    """values[key] as an integer (`default` when absent); InputError when it is not one."""
    if key not in values:
        return default
    try:
        return int(values[key])
    except ValueError as exc:
        raise InputError(f"{key}={values[key]!r} is not an integer") from exc


def _bool(values: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in values:
        return default
    word = values[key].lower()
    if word not in ("true", "false", "1", "0", "yes", "no"):
        raise InputError(f"{key}={values[key]!r} is not true/false")
    return word in ("true", "1", "yes")


def spec_from_options(values: Mapping[str, str], base: DecoderSpec = DecoderSpec(),
                      registry: DrafterRegistry = DRAFTERS) -> DecoderSpec:
    """`base` with the decoder keys and the chosen drafter's keys of `values` applied."""
    allowed = DECODER_KEYS | drafter_keys(registry)
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(allowed))}")
    own = {k: v for k, v in values.items() if k not in DECODER_KEYS}
    proposer = values.get("proposer", base.proposer)
    if "calibration" in values and proposer != "auto":
        raise InputError(f"calibration= configures proposer=auto, not {proposer}")
    if proposer == base.proposer and not own and "proposer" not in values:
        drafter = base.drafter
    else:
        drafter = parse_drafter(proposer, own, registry, values.get("calibration"))
    gen = base.generation
    limits = TreeLimits(int_value(values, "max_nodes", gen.limits.max_nodes),
                        int_value(values, "max_depth", gen.limits.max_depth))
    return replace(
        base,
        target=values.get("target", base.target),
        backend=values.get("backend", base.backend),
        drafter=drafter,
        draft=values.get("draft", base.draft),
        verifier=values.get("verifier", base.verifier),
        gate=parse_gate(values["gate"]) if "gate" in values else base.gate,
        dtype=cast(DtypeChoice, check_dtype(values["dtype"])) if "dtype" in values else base.dtype,
        strict=Strict.parse(values["strict"]) if "strict" in values else base.strict,
        generation=replace(gen, limits=limits, exact=_bool(values, "exact", gen.exact)),
    )
