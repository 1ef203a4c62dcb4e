"""The package's layers, checked on its source and on a traced call: no import cycle (lazy and
TYPE_CHECKING imports included), no import up a layer, and `open_decoder`'s walk of a spec
straight down the stages (parse -> plan -> build), the build stage entered once.

    0  cli        the commands
    1  tools      bench, oracles, training, serve (they call the library; the library never calls them)
    2  api        open_decoder: parse -> plan -> build
    3  parse      option strings -> a typed DecoderSpec, once, at the edge
    4  plan       every auto resolved (check, load, resolve)
    5  optimize, measure   the planner's measurements and searches
    6  build      a concrete spec on loaded backends -> a decoder; preflight (refusals before loading)
    7  runtime    spec, engine, gate, sampling, verify, topology, proposers, backends, heads, ...

A module may import its own layer and those below it, never one above.  The walk is traced
call by call: a call from a module into a module of a higher layer is a climb back up."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "draftwise"

LAYERS = (("draftwise.cli", 0), ("draftwise.bench", 1), ("draftwise.oracles", 1), ("draftwise.training", 1), ("draftwise.vllm", 1),
          ("draftwise.serve", 1),
          ("draftwise.api", 2),
          ("draftwise.parse", 3), ("draftwise.plan", 4), ("draftwise.optimize", 5), ("draftwise.measure", 5),
          ("draftwise.build", 6),
          ("draftwise.preflight", 6))
RUNTIME = 7
# inside the runtime, the roles that may not reach each other (a backend runs a model, a verifier
# reads logits: neither knows proposers or the round loop)
# the round's own modules (runtime/): what decides and drives a round
ROUND = ("round", "engine", "strategy", "decoder", "guard", "shadow", "gate", "union_walks")
RUNTIME_FORBIDDEN = {
    "backends": ("verify", "proposers", *ROUND),
    "verify": ("backends", "proposers", *ROUND),
    "topology": ("verify", "backends", "proposers", *ROUND),
}


def role(module: str) -> str:
    """A runtime module's role: its subpackage, or inside `runtime/` the module itself."""
    parts = module.split(".")
    return parts[2] if parts[1] == "runtime" and len(parts) > 2 else parts[1]


def layer(module: str) -> int:
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return RUNTIME


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(module, line) of every draftwise module `path` imports anywhere: at the top, under
    TYPE_CHECKING or inside a function (a lazy import is still a dependency)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                name = full if full in known else node.module
                if name in known:
                    out.append((name, node.lineno))
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {t for t, _ in imports(p, known) if t != m} for m, p in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_a_layer_above_its_own():
    known = modules()
    upward = [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)}) at line {line}"
              for m, p in sorted(known.items()) if m != "draftwise"
              for t, line in imports(p, known) if t != "draftwise" and layer(t) < layer(m)]
    assert upward == []


def test_runtime_roles_do_not_reach_each_other():
    known = modules()
    crossing = [f"{m} imports {t}" for m, p in sorted(known.items()) if layer(m) == RUNTIME and m.count(".")
                for t, _ in imports(p, known)
                if t.count(".") and role(t) in RUNTIME_FORBIDDEN.get(role(m), ())]
    assert crossing == []
    assert role("draftwise.runtime.engine") in RUNTIME_FORBIDDEN["backends"]  # a planted backend -> engine import
    assert role("draftwise.runtime.sampling") not in RUNTIME_FORBIDDEN["backends"]


def test_the_checker_catches_a_planted_upward_import(tmp_path):
    planted = tmp_path / "engine.py"
    planted.write_text("def f():\n    from draftwise.optimize.auto import auto_tree\n")
    found = imports(planted, modules())
    assert [(t, layer(t)) for t, _ in found] == [("draftwise.optimize.auto", 5)] and layer("draftwise.runtime.engine") > 5


def test_the_stage_modules_sit_in_their_layers():
    """A planted rename (plan back into the runtime layer) must not pass unnoticed."""
    assert [layer(m) for m in ("draftwise.cli.main", "draftwise.api", "draftwise.parse", "draftwise.plan",
                               "draftwise.optimize.auto", "draftwise.build", "draftwise.runtime.engine")] == [0, 2, 3, 4, 5, 6, 7]
    assert all(m in modules() for m in ("draftwise.api", "draftwise.parse", "draftwise.plan", "draftwise.build"))


class Walk:
    """Every call from one draftwise module into another while tracing: (caller, callee)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def _module(self, frame) -> str | None:
        filename = frame.f_code.co_filename
        try:
            rel = Path(filename).resolve().relative_to(SRC)
        except ValueError:
            return None
        return ".".join(rel.with_suffix("").parts).removesuffix(".__init__")

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = self._module(frame)
        if callee is None:
            return
        caller_frame = frame.f_back
        while caller_frame is not None and self._module(caller_frame) is None:
            caller_frame = caller_frame.f_back
        caller = self._module(caller_frame) if caller_frame is not None else None
        if caller is not None and caller != callee:
            self.calls.append((caller, callee))

    def climbs(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.calls if layer(b) < layer(a)]

    def entries(self, module: str) -> int:
        return sum(1 for a, b in self.calls if b == module)

    def stays(self) -> list[str]:
        """The stage files the walk passes through, in order (consecutive repeats merged)."""
        seq: list[str] = []
        for _, callee in self.calls:
            if layer(callee) < RUNTIME and (not seq or seq[-1] != callee):
                seq.append(callee)
        return seq


def traced(fn):
    walk = Walk()
    sys.setprofile(walk)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return walk, result


def test_the_walk_tracer_sees_real_calls_and_a_planted_climb():
    from draftwise import plan as plan_module
    from draftwise.spec import DecoderSpec

    traced_walk, _ = traced(lambda: plan_module.check(DecoderSpec()))
    assert ("draftwise.plan", "draftwise.preflight") in traced_walk.calls and traced_walk.climbs() == []
    planted = Walk()
    planted.calls = [("draftwise.api", "draftwise.build"), ("draftwise.runtime.engine", "draftwise.plan")]
    assert planted.climbs() == [("draftwise.runtime.engine", "draftwise.plan")] and planted.entries("draftwise.build") == 1


@pytest.fixture(scope="module")
def tiny_with_profile(tmp_path_factory):
    from draftwise.measure.profile import write_profile
    from tests.integration.tiny_models import tiny_backend

    target = tiny_backend(0)
    directory = tmp_path_factory.mktemp("profile")
    write_profile(target, directory, prefix_len=8, rows=(1, 2, 4), repeats=1)
    return target, directory


def test_open_decoder_walks_the_spec_straight_down(tiny_with_profile):
    from draftwise.api import open_decoder

    target, profile = tiny_with_profile
    from draftwise.runtime.round import GenerationConfig
    from draftwise.spec import DecoderSpec

    base = DecoderSpec(backend="transformers", generation=GenerationConfig(max_new_tokens=4))
    walk, decoder = traced(lambda: open_decoder(base, loader=lambda model, backend, role: target,
                                                proposer="prompt-lookup", gate=str(profile)))
    assert decoder.spec.gate is not None and decoder.verifier == "greedy"
    assert walk.climbs() == [], walk.calls
    assert walk.entries("draftwise.build") == 1, walk.calls
    stages = [s for s in walk.stays() if s in ("draftwise.parse", "draftwise.plan", "draftwise.build")]
    assert stages[:3] == ["draftwise.parse", "draftwise.plan", "draftwise.build"], walk.stays()
    assert stages.count("draftwise.parse") == 1 and stages.count("draftwise.build") == 1, walk.stays()
