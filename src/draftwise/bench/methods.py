"""Method configurations: `--method NAME=CONFIG`, parsed into frozen specs.

CONFIG is one of
    dw[:KEY=VALUE,...]            a draftwise decoder, built through `draftwise.build`
    hf-plain | hf-assisted | hf-prompt-lookup | llamacpp-plain | llamacpp-prompt-lookup [:KEY=VALUE,...]
    FILE.json | FILE.toml         the same keys as a table, plus "method" (default "dw")
`NAME=` may be left out; the name is then CONFIG itself.

Keys of dw (defaults are the library's own, from DecoderSpec and the component configs):
    proposer  none | prompt-lookup | draft-model | rest | auto    backend  auto | transformers | llamacpp
    verifier  auto | greedy | membership | ...               target, draft  model names (default --target/--draft)
    k, confidence                draft chain length and confidence stop
    tree, relation               draft tree template (wbd:2,2,1) and how children are drawn
    lookup, ngram, candidates    prompt-lookup tokens, max n-gram, continuations (tree when > 1)
    index                        REST datastore          max_nodes, max_depth   tree limits
    gate                         cost gate: auto or a verify_profile directory
    calibration                  proposer=auto: the workload its plain traces come from (default humaneval:0-1)
    exact                        false permits a heuristic verifier
Keys of peers: target; draft (hf-assisted); tokens (prompt-lookup peers, default 10).

A comma-separated item without '=' continues the previous value, so tree templates keep
their commas: `dw:proposer=draft-model,tree=wbd:2,2,1,k=4`.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from draftwise.bench.pool import llama_logits_all
from draftwise.build import BACKENDS, PROPOSERS, DecoderSpec, choose_backend, planned_contracts, preflight
from draftwise.engine import GenerationConfig
from draftwise.models import resolve
from draftwise.optimize.auto_proposer import CALIBRATION_WORKLOAD, auto_preflight
from draftwise.topology.compile import TreeLimits

PEERS = ("hf-plain", "hf-assisted", "hf-prompt-lookup", "llamacpp-plain", "llamacpp-prompt-lookup")
PEER_BACKEND = {p: ("transformers" if p.startswith("hf-") else "llamacpp") for p in PEERS}
PEER_LOOKUP_TOKENS = 10  # transformers' and llama-cpp-python's usual prompt-lookup length
_DW_KEYS = {"proposer", "backend", "verifier", "target", "draft", "k", "confidence", "tree", "relation", "lookup",
            "ngram", "candidates", "index", "max_nodes", "max_depth", "exact", "gate", "calibration"}
_PEER_KEYS = {"hf-plain": {"target"}, "hf-assisted": {"target", "draft"}, "hf-prompt-lookup": {"target", "tokens"},
              "llamacpp-plain": {"target"}, "llamacpp-prompt-lookup": {"target", "tokens"}}


_PROPOSER_KEYS = {"draft-model": {"k", "confidence", "tree", "relation"}, "prompt-lookup": {"lookup", "ngram", "candidates"},
                  "rest": {"index"}}


class MethodError(ValueError):
    """A --method that cannot be parsed or does not fit together."""


@dataclass(frozen=True)
class MethodDefaults:
    """What every method shares unless its config says otherwise."""

    target: str
    draft: str | None
    generation: GenerationConfig


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kind: str  # "dw" or one of PEERS
    backend: str  # "transformers" or "llamacpp" once resolved; dw may say "auto" until then
    target: str
    draft: str | None = None
    decoder: DecoderSpec | None = None  # dw only
    lookup_tokens: int = PEER_LOOKUP_TOKENS  # prompt-lookup peers only
    calibration: str = CALIBRATION_WORKLOAD  # dw with proposer=auto only: where its plain traces come from

    @property
    def is_plain(self) -> bool:
        """A method that proposes nothing: the reference its backend's other methods are checked against."""
        if self.kind == "dw":
            return self.decoder is not None and self.decoder.proposer == "none"
        return self.kind in ("hf-plain", "llamacpp-plain")

    @property
    def peer_lookup_tokens(self) -> int | None:
        """The lookup length llama-cpp-python's `Llama` is opened with: None but for its lookup peer."""
        return self.lookup_tokens if self.kind == "llamacpp-prompt-lookup" else None

    @property
    def family(self) -> tuple[str, str]:
        """Methods of one family must produce the same greedy tokens."""
        return (self.backend, self.target)

    def describe(self) -> str:
        if self.kind != "dw":
            extra = f", draft={self.draft}" if self.kind == "hf-assisted" else ""
            extra += f", tokens={self.lookup_tokens}" if self.kind.endswith("prompt-lookup") else ""
            if llama_logits_all(self.peer_lookup_tokens):
                extra += ", logits_all=True"  # how the pool opens it: every report carries it
            return f"{self.kind} (target={self.target}{extra})"
        d = self.decoder
        parts = [f"proposer={d.proposer}", f"backend={self.backend}", f"verifier={d.verifier}", f"target={self.target}"]
        if d.proposer == "draft-model":
            shape = [f"tree={d.tree}", f"relation={d.relation}"] if d.tree else [f"k={d.draft_config.k}"]
            parts += [f"draft={d.draft}", *shape]
        if d.proposer == "prompt-lookup":
            p = d.prompt_lookup
            parts += [f"lookup={p.num_tokens}", f"ngram={p.max_ngram}", f"candidates={p.max_candidates}"]
        if d.gate:
            parts.append(f"gate={d.gate}")
        if not d.generation.exact:
            parts.append("exact=false (HEURISTIC verifier allowed: outputs are not the target's distribution)")
        return "dw: " + ", ".join(parts)

    @property
    def heuristic(self) -> bool:
        """A draftwise method allowed a heuristic verifier: its output is not the target's law."""
        return self.kind == "dw" and not self.decoder.generation.exact


def parse_method(text: str, defaults: MethodDefaults) -> MethodSpec:
    name, sep, config = text.partition("=")
    if not sep or ":" in name or "," in name:  # "dw:proposer=none" has its first '=' inside the config
        name, config = text, text
    name, config = name.strip(), config.strip()
    if not name:
        raise MethodError(f"--method {text!r}: empty name")
    kind, values = _read_config(config)
    if kind == "dw":
        return _dw_method(name, values, defaults)
    if kind in PEERS:
        return _peer_method(name, kind, values, defaults)
    raise MethodError(f"--method {text!r}: unknown method {kind!r}; choose dw or one of {', '.join(PEERS)}")


def _read_config(config: str) -> tuple[str, dict[str, str]]:
    path = Path(config)
    if path.suffix in (".json", ".toml"):
        if not path.is_file():
            raise MethodError(f"method config file {path} not found")
        loaded = json.loads(path.read_text()) if path.suffix == ".json" else tomllib.loads(path.read_text())
        if not isinstance(loaded, dict):
            raise MethodError(f"{path}: a method config is a table of keys")
        kind = str(loaded.pop("method", "dw"))
        return kind, {k: _as_text(v) for k, v in loaded.items()}
    kind, _, rest = config.partition(":")
    return kind.strip(), parse_pairs(rest)


def _as_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value)  # a JSON tree of paths
    return str(value)


def parse_pairs(text: str) -> dict[str, str]:
    """'a=1,tree=wbd:2,2,1,b=x' -> {'a': '1', 'tree': 'wbd:2,2,1', 'b': 'x'}."""
    pairs: dict[str, str] = {}
    last: str | None = None
    for item in text.split(",") if text.strip() else []:
        key, sep, value = item.partition("=")
        if sep and key.strip() and not key.strip().startswith("["):
            last = key.strip()
            if last in pairs:
                raise MethodError(f"key {last!r} given twice in {text!r}")
            pairs[last] = value.strip()
        elif last is not None:
            pairs[last] += "," + item.strip()
        else:
            raise MethodError(f"{item!r} in {text!r} is not KEY=VALUE")
    return pairs


def _check_keys(kind: str, values: dict[str, str], allowed: set[str]) -> None:
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise MethodError(f"{kind}: unknown key(s) {unknown}; allowed: {', '.join(sorted(allowed))}")


def _int(values: dict[str, str], key: str, default: int) -> int:
    if key not in values:
        return default
    try:
        return int(values[key])
    except ValueError as exc:
        raise MethodError(f"{key}={values[key]!r} is not an integer") from exc


def _float(values: dict[str, str], key: str, default: float) -> float:
    if key not in values:
        return default
    try:
        return float(values[key])
    except ValueError as exc:
        raise MethodError(f"{key}={values[key]!r} is not a number") from exc


def _bool(values: dict[str, str], key: str, default: bool) -> bool:
    if key not in values:
        return default
    word = values[key].lower()
    if word not in ("true", "false", "1", "0", "yes", "no"):
        raise MethodError(f"{key}={values[key]!r} is not true/false")
    return word in ("true", "1", "yes")


def _dw_method(name: str, values: dict[str, str], defaults: MethodDefaults) -> MethodSpec:
    _check_keys("dw", values, _DW_KEYS)
    proposer = values.get("proposer", DecoderSpec().proposer)
    for owner, keys in _PROPOSER_KEYS.items():
        misplaced = sorted(keys & set(values)) if owner != proposer else []
        if misplaced:  # silently ignoring it would benchmark a configuration nobody asked for
            raise MethodError(f"method {name!r}: {', '.join(misplaced)} configure proposer={owner}, not {proposer}")
    base = DecoderSpec()
    target = values.get("target", defaults.target)
    draft = values.get("draft", defaults.draft)
    gen = defaults.generation
    limits = TreeLimits(_int(values, "max_nodes", gen.limits.max_nodes), _int(values, "max_depth", gen.limits.max_depth))
    try:
        spec = DecoderSpec(
            target=target,
            backend=values.get("backend", base.backend),
            proposer=values.get("proposer", base.proposer),
            draft=draft,
            verifier=values.get("verifier", base.verifier),
            prompt_lookup=replace(base.prompt_lookup, num_tokens=_int(values, "lookup", base.prompt_lookup.num_tokens),
                                  max_ngram=_int(values, "ngram", base.prompt_lookup.max_ngram),
                                  max_candidates=_int(values, "candidates", base.prompt_lookup.max_candidates)),
            draft_config=replace(base.draft_config, k=_int(values, "k", base.draft_config.k),
                                 confidence_threshold=_float(values, "confidence", base.draft_config.confidence_threshold)),
            tree=values.get("tree"),
            relation=values.get("relation", base.relation),
            index=values.get("index"),
            gate=values.get("gate"),
            generation=replace(gen, limits=limits, exact=_bool(values, "exact", gen.exact)),
        )
        if "calibration" in values and spec.proposer != "auto":
            raise MethodError(f"method {name!r}: calibration= configures proposer=auto, not {spec.proposer}")
        if spec.proposer not in (*PROPOSERS, "auto"):  # planned_contracts reads anything unknown as REST
            raise MethodError(f"method {name!r}: unknown proposer {spec.proposer!r}; "
                              f"choose {', '.join(PROPOSERS)} or auto")
        if spec.backend not in BACKENDS:
            raise MethodError(f"method {name!r}: unknown backend {spec.backend!r}; choose {', '.join(BACKENDS)}")
        if spec.proposer == "draft-model" and not spec.draft:
            raise MethodError(f"method {name!r}: proposer=draft-model needs draft=MODEL (or --draft)")
        if spec.proposer == "auto":
            auto_preflight(spec)  # every candidate against the verifier, before any model is loaded
        else:
            planned_contracts(spec)  # unknown proposer, bad tree template, bad relation
            preflight(spec)  # verifier refuses the contracts before any model is loaded
    except MethodError:
        raise
    except ValueError as exc:
        raise MethodError(f"method {name!r}: {exc}") from exc
    return MethodSpec(name=name, kind="dw", backend=spec.backend, target=target,
                      draft=draft if spec.proposer in ("draft-model", "auto") else None, decoder=spec,
                      calibration=values.get("calibration", CALIBRATION_WORKLOAD))


def _peer_method(name: str, kind: str, values: dict[str, str], defaults: MethodDefaults) -> MethodSpec:
    _check_keys(kind, values, _PEER_KEYS[kind])
    draft = values.get("draft", defaults.draft) if kind == "hf-assisted" else None
    if kind == "hf-assisted" and not draft:
        raise MethodError(f"method {name!r}: hf-assisted needs a draft model (draft=MODEL or --draft)")
    tokens = _int(values, "tokens", PEER_LOOKUP_TOKENS)
    if tokens < 1:
        raise MethodError(f"method {name!r}: tokens must be >= 1")
    return MethodSpec(name=name, kind=kind, backend=PEER_BACKEND[kind], target=values.get("target", defaults.target),
                      draft=draft, lookup_tokens=tokens)


def resolve_backend(method: MethodSpec) -> MethodSpec:
    """Settle backend=auto (needs the model's kind, not its weights), so families are known."""
    if method.backend != "auto":
        return method
    backend = choose_backend("auto", resolve(method.target, pull=False))
    return replace(method, backend=backend, decoder=replace(method.decoder, backend=backend))


def references(methods: list[MethodSpec]) -> dict[str, str | None]:
    """Method name -> name of the plain reference of its family (draftwise plain first, else the peer plain)."""
    chosen: dict[tuple[str, str], str] = {}
    for preferred in (True, False):
        for m in methods:
            if m.is_plain and (m.kind == "dw") == preferred:
                chosen.setdefault(m.family, m.name)
    return {m.name: chosen.get(m.family) for m in methods}


def check_names(methods: list[MethodSpec]) -> None:
    names = [m.name for m in methods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise MethodError(f"method names repeat: {duplicates}; give each a NAME= prefix")
    for n in names:
        if not n.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise MethodError(f"method name {n!r}: use letters, digits, '-', '_' and '.' (it names a file; "
                              "write NAME=CONFIG)")
