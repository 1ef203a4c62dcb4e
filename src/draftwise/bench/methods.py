"""Method configurations: `--method NAME=CONFIG`, parsed into frozen specs.

CONFIG is one of
    dw[:KEY=VALUE,...]            a draftwise decoder, built through `draftwise.build`
    hf-plain | hf-assisted | hf-prompt-lookup | llamacpp-plain | llamacpp-prompt-lookup [:KEY=VALUE,...]
    FILE.json | FILE.toml         the same keys as a table, plus "method" (default "dw")
`NAME=` may be left out; the name is then CONFIG itself.

Keys of dw: the decoder keys of `draftwise.spec` (proposer, backend, verifier, target, draft,
gate, max_nodes, max_depth, exact, calibration; not dtype, which is the run's `--dtype`) and the chosen proposer's own config keys
(`draftwise proposers` lists them: k, confidence, tree, relation for draft-model; lookup,
ngram, candidates for prompt-lookup; index for rest; ...).  An unknown key is refused with
the valid ones; a key of another proposer is refused with the proposer it configures.
Keys of peers: target; draft (hf-assisted); tokens (prompt-lookup peers, default 10); feed
(llamacpp-plain: `generate`, the default, runs `Llama.generate` on the whole prompt as users
do; `draftwise` feeds the prompt as draftwise's engine does, on a context with draftwise's
settings, so its tokens can be checked against draftwise's llama.cpp plain decoding: see
`bench/peers.py`).

A comma-separated item without '=' continues the previous value, so tree templates keep
their commas: `dw:proposer=draft-model,tree=wbd:2,2,1,k=4`.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice
from draftwise.bench.pool import llama_logits_all
from draftwise.backends.load import choose_backend
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import DraftwiseError, InputError
from draftwise.models import resolve
from draftwise.paths import is_file
from draftwise.plan import check
from draftwise.spec import DecoderSpec
from draftwise.parse import int_value, spec_from_options

PEERS = ("hf-plain", "hf-assisted", "hf-prompt-lookup", "llamacpp-plain", "llamacpp-prompt-lookup")
PEER_BACKEND = {p: ("transformers" if p.startswith("hf-") else "llamacpp") for p in PEERS}
PEER_LOOKUP_TOKENS = 10  # transformers' and llama-cpp-python's usual prompt-lookup length
_PEER_KEYS = {"hf-plain": {"target"}, "hf-assisted": {"target", "draft"}, "hf-prompt-lookup": {"target", "tokens"},
              "llamacpp-plain": {"target", "feed"}, "llamacpp-prompt-lookup": {"target", "tokens"}}
VLLM_KINDS_WITH_VALUE = ("vllm-custom", "vllm-export", "vllm-export-custom")  # their strings hold '=' themselves
FEEDS = ("generate", "draftwise")  # how llamacpp-plain feeds the prompt (peers.py): as users run it, or like draftwise


class MethodError(InputError):
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
    feed: str = "generate"  # llamacpp-plain only: one of FEEDS
    dtype: DtypeChoice = DEFAULT_DTYPE  # transformers methods: the run's (`with_run_dtype`)
    vllm: str | None = None  # kind "vllm": the vLLM method string (`draftwise.vllm.methods.parse_method`)

    @property
    def is_plain(self) -> bool:
        """A method that proposes nothing: the reference its backend's other methods are checked against."""
        if self.kind == "dw":
            return self.decoder is not None and self.decoder.drafter is None
        if self.kind == "vllm":
            return self.vllm == "vllm-plain"
        return self.kind in ("hf-plain", "llamacpp-plain")

    @property
    def peer_lookup_tokens(self) -> int | None:
        """The lookup length llama-cpp-python's `Llama` is opened with: None but for its lookup peer."""
        return self.lookup_tokens if self.kind == "llamacpp-prompt-lookup" else None

    @property
    def fed_like_draftwise(self) -> bool:
        """The llama.cpp plain peer fed and configured as draftwise's engine and backend are (feed=draftwise)."""
        return self.kind == "llamacpp-plain" and self.feed == "draftwise"

    @property
    def family(self) -> tuple[str, str]:
        """Methods of one family must produce the same greedy tokens (strict llama.cpp methods
        form their own family: their plain decoding runs other kernels than the default's)."""
        scope = self.decoder.strict_scope if self.kind == "dw" and self.decoder is not None else None
        if self.kind == "vllm":  # vLLM's kernels: its methods are checked against vLLM's plain decoding
            return ("vllm", self.target)
        return (self.backend + (f" strict {scope}" if scope else ""), self.target)

    def describe(self) -> str:
        if self.kind == "vllm":
            return f"{self.vllm} (vLLM, target={self.target}, dtype={self.dtype})"
        if self.kind != "dw":
            extra = f", draft={self.draft}" if self.kind == "hf-assisted" else ""
            extra += f", tokens={self.lookup_tokens}" if self.kind.endswith("prompt-lookup") else ""
            extra += ", feed=draftwise" if self.fed_like_draftwise else ""
            if llama_logits_all(self.peer_lookup_tokens):
                extra += ", logits_all=True"  # how the pool opens it: every report carries it
            if self.dtype != DEFAULT_DTYPE:
                extra += f", dtype={self.dtype}"
            return f"{self.kind} (target={self.target}{extra})"
        return "dw: " + self.decoder.describe()

    @property
    def heuristic(self) -> bool:
        """A draftwise method allowed a heuristic verifier: its output is not the target's law."""
        return self.kind == "dw" and not self.decoder.generation.exact


def parse_method(text: str, defaults: MethodDefaults) -> MethodSpec:
    name, sep, config = text.partition("=")
    if not sep or ":" in name or "," in name:  # "dw:proposer=none" has its first '=' inside the config
        name, config = text, text
    elif name.strip() in VLLM_KINDS_WITH_VALUE and not config.startswith("vllm-"):  # vllm-custom=prompt-lookup
        name, config = text, text
    name, config = name.strip(), config.strip()
    if not name:
        raise MethodError(f"--method {text!r}: empty name")
    if config.startswith("vllm-"):
        return _vllm_method(name, config, defaults)
    kind, values = _read_config(config)
    if kind == "dw":
        return _dw_method(name, values, defaults)
    if kind in PEERS:
        return _peer_method(name, kind, values, defaults)
    raise MethodError(f"--method {text!r}: unknown method {kind!r}; choose dw, one of {', '.join(PEERS)}, or a "
                      "vllm-... method (docs/vllm.md)")


def _read_config(config: str) -> tuple[str, dict[str, str]]:
    path = Path(config)
    if path.suffix in (".json", ".toml"):
        if not is_file(path):
            raise MethodError(f"method config file {path} not found")
        try:
            text = path.read_text(encoding="utf-8")
            loaded = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON / TOML
            raise MethodError(f"method config file {path} cannot be read as {path.suffix[1:].upper()}: {exc}") from exc
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


def _dw_method(name: str, values: dict[str, str], defaults: MethodDefaults) -> MethodSpec:
    if "dtype" in values:  # the HF peers run the very model objects: one dtype for the whole run
        raise MethodError(f"method {name!r}: dtype is the run's (bench --dtype), so draftwise's transformers methods "
                          "and the HF peers share one model object")
    base = DecoderSpec(target=defaults.target, draft=defaults.draft, generation=defaults.generation)
    try:
        spec = spec_from_options(values, base)
        if not spec.uses_draft_model:
            spec = replace(spec, draft=None)  # a --draft for other methods is not this one's
        check(spec)  # the verifier refuses the contracts before any model is loaded
    except DraftwiseError as exc:  # bad keys, and pairings the verifier refuses
        raise MethodError(f"method {name!r}: {exc}") from exc
    return MethodSpec(name=name, kind="dw", backend=spec.backend, target=spec.target, draft=spec.draft, decoder=spec)



def _vllm_method(name: str, config: str, defaults: MethodDefaults) -> MethodSpec:
    """A vLLM method (run in .venv-vllm by `draftwise.vllm`), parsed now so a bad string fails before any load."""
    from draftwise.vllm.methods import parse_method as parse_vllm

    try:
        parse_vllm(config)
    except DraftwiseError as exc:
        raise MethodError(f"method {name!r}: {exc}") from exc
    return MethodSpec(name=name, kind="vllm", backend="transformers", target=defaults.target, vllm=config)


def _peer_method(name: str, kind: str, values: dict[str, str], defaults: MethodDefaults) -> MethodSpec:
    _check_keys(kind, values, _PEER_KEYS[kind])
    draft = values.get("draft", defaults.draft) if kind == "hf-assisted" else None
    if kind == "hf-assisted" and not draft:
        raise MethodError(f"method {name!r}: hf-assisted needs a draft model (draft=MODEL or --draft)")
    try:
        tokens = int_value(values, "tokens", PEER_LOOKUP_TOKENS)
    except InputError as exc:
        raise MethodError(f"method {name!r}: {exc}") from exc
    if tokens < 1:
        raise MethodError(f"method {name!r}: tokens must be >= 1")
    feed = values.get("feed", "generate")
    if feed not in FEEDS:
        raise MethodError(f"method {name!r}: feed must be one of {', '.join(FEEDS)}, not {feed!r}")
    return MethodSpec(name=name, kind=kind, backend=PEER_BACKEND[kind], target=values.get("target", defaults.target),
                      draft=draft, lookup_tokens=tokens, feed=feed)


def resolve_backend(method: MethodSpec) -> MethodSpec:
    """Settle backend=auto (needs the model's kind, not its weights), so families are known."""
    if method.backend != "auto":
        return method
    backend = choose_backend("auto", resolve(method.target, pull=False))
    return replace(method, backend=backend, decoder=replace(method.decoder, backend=backend))


def with_run_dtype(method: MethodSpec, dtype: DtypeChoice) -> MethodSpec:
    """A transformers method in the run's dtype (the pool loads its models in it); llama.cpp
    methods keep the GGUF's own types.  Call after `resolve_backend`."""
    if method.backend != "transformers" or dtype == method.dtype:
        return method
    decoder = None if method.decoder is None else replace(method.decoder, dtype=dtype)
    return replace(method, dtype=dtype, decoder=decoder)


def references(methods: list[MethodSpec]) -> dict[str, str | None]:
    """Method name -> name of the plain reference of its family: draftwise plain first, else the
    llama.cpp plain peer fed like draftwise (feed=draftwise), else the peer plain as users run it."""
    chosen: dict[tuple[str, str], str] = {}
    for rank in (0, 1, 2):
        for m in methods:
            if m.is_plain and _reference_rank(m) == rank:
                chosen.setdefault(m.family, m.name)
    return {m.name: chosen.get(m.family) for m in methods}


def _reference_rank(method: MethodSpec) -> int:
    return 0 if method.kind == "dw" else 1 if method.fed_like_draftwise else 2


def check_names(methods: list[MethodSpec]) -> None:
    names = [m.name for m in methods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise MethodError(f"method names repeat: {duplicates}; give each a NAME= prefix")
    for n in names:
        if not n.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise MethodError(f"method name {n!r}: use letters, digits, '-', '_' and '.' (it names a file; "
                              "write NAME=CONFIG)")
