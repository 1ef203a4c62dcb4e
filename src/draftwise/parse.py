"""Strings to a typed `DecoderSpec`, once, at the edge.

`spec_from_options` reads the same keys wherever they come from (the CLI's options and
`--set`, a bench method string, a TOML or JSON file, `open_decoder`'s keyword options), so a
configuration means the same thing everywhere.  Nothing below this module parses option
strings; it calls nothing above `draftwise.spec`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path
from typing import Mapping, cast

from draftwise.backends.dtype import DtypeChoice, check_dtype
from draftwise.errors import InputError
from draftwise.options import config_keys, parse_config
from draftwise.paths import is_dir
from draftwise.proposers.family import DrafterRegistry
from draftwise.proposers.registry import DRAFTERS
from draftwise.spec import (CALIBRATION_WORKLOAD, UNION_SEPARATOR, AutoDrafter, AutoGate, DecoderSpec, Drafter,
                            DrafterSpec, GatePolicy, GateProfile, Guard, Strict, UnionDrafter)
from draftwise.topology.compile import TreeLimits


def drafter_keys(registry: DrafterRegistry = DRAFTERS) -> set[str]:
    return {key for family in registry.families() for key in config_keys(family.config)}


DECODER_KEYS = frozenset({"proposer", "backend", "verifier", "target", "draft", "gate", "max_nodes", "max_depth",
                          "exact", "calibration", "dtype", "strict", "batch", "guard"})


def parse_drafter(name: str, values: Mapping[str, str], registry: DrafterRegistry = DRAFTERS,
                  calibration: str | None = None) -> Drafter | None:
    """The drafter named `name` with its config keys parsed from `values` (the keys of other
    families are refused: silently ignoring one would run a configuration nobody asked for)."""
    if name == "none":
        _refuse_keys(values, "proposer none takes no drafter keys")
        return None
    if name == "auto":
        return _parse_auto(values, registry, calibration)
    if UNION_SEPARATOR in name and name not in registry.names():  # hydra++ is one family
        return _parse_union(name, values, registry)
    family = registry.get(name)
    own = set(config_keys(family.config))
    foreign = sorted(set(values) - own)
    if foreign:
        owners = {k: [f.name for f in registry.families() if k in config_keys(f.config)] for k in foreign}
        said = "; ".join(f"{k} configures {', '.join(o) or 'nothing'}" for k, o in owners.items())
        raise InputError(f"proposer {name}: {said}, not {name}; its keys: {', '.join(sorted(own)) or 'none'}")
    return DrafterSpec(family, parse_config(family.config, values, f"proposer {name}"))


def union_members(name: str, registry: DrafterRegistry = DRAFTERS) -> list[str]:
    """The family names of `a+b[+c]`, read against the registry (a family's own name may hold a
    '+': `prompt-lookup+hydra++` is prompt-lookup and hydra++)."""
    words, start = [], 0
    while start <= len(name):
        fits = [n for n in registry.names() if name.startswith(n, start)
                and (start + len(n) == len(name) or name[start + len(n)] == UNION_SEPARATOR)]
        if not fits:
            raise InputError(f"proposer {name}: {name[start:]!r} does not start with a registered family; a union joins "
                             f"families with '+' ({', '.join(registry.names())}; none and auto cannot be members)")
        word = max(fits, key=len)
        words.append(word)
        start += len(word) + 1
    return words


def _parse_union(name: str, values: Mapping[str, str], registry: DrafterRegistry) -> UnionDrafter:
    """`a+b[+c]`: each member takes the given keys it declares (a key two members declare
    configures both); a key no member declares is refused."""
    families = [registry.get(w) for w in union_members(name, registry)]
    on_target = [f.name for f in families if f.drafts_on_target]
    if on_target:
        raise InputError(f"proposer {name}: {', '.join(on_target)} drafts with the target's own layers and is not "
                         "combined with other sources (its draft and verify share the target's state)")
    owned = {k for f in families for k in config_keys(f.config)}
    foreign = sorted(set(values) - owned)
    if foreign:
        raise InputError(f"proposer {name}: {', '.join(foreign)} configures none of {', '.join(f.name for f in families)}; "
                         f"their keys: {', '.join(sorted(owned)) or 'none'}")
    return UnionDrafter(tuple(
        DrafterSpec(f, parse_config(f.config, {k: v for k, v in values.items() if k in config_keys(f.config)},
                                    f"proposer {name} ({f.name})"))
        for f in families))


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
    if not is_dir(text):  # a name too long for the file system is no directory either
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


def bool_value(values: Mapping[str, str], key: str, default: bool) -> bool:
    """values[key] as a boolean (`default` when absent); InputError when it is not one."""
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
        max_batch=int_value(values, "batch", base.max_batch),
        guard=Guard.parse(values["guard"]) if "guard" in values else base.guard,
        generation=replace(gen, limits=limits, exact=bool_value(values, "exact", gen.exact)),
    )
