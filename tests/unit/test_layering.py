"""The layers of the package, checked on its source: no module imports a layer above its own
(lazy imports inside functions included), and the top-level imports form no cycle.

    core      contracts, sampling, topology, verify, backends, proposers, engine, gate, ...
    build     spec (typed configurations), build (a concrete spec -> a decoder)
    planning  optimize, oracles, training (measure, calibrate, replay, choose, train)
    app       resolve (every auto -> a recorded choice), api (open_decoder)
    bench     the benchmark harness
    cli       the commands
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import draftwise

ROOT = Path(draftwise.__file__).parent
LAYERS = ("core", "build", "planning", "app", "bench", "cli")
# inside the core, the roles that may not reach each other (a backend runs a model, a verifier
# reads logits: neither knows proposers or the round loop)
CORE_FORBIDDEN = {
    "backends": ("verify", "proposers", "engine", "gate"),
    "verify": ("backends", "proposers", "engine", "gate"),
    "topology": ("verify", "backends", "proposers", "engine", "gate"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else ""
    if module == "draftwise":  # the package facade re-exports the public API
        return "app"
    if head in ("spec", "build"):
        return "build"
    if head in ("optimize", "oracles", "training"):
        return "planning"
    if head in ("resolve", "api"):
        return "app"
    if head == "bench":
        return "bench"
    if head.startswith("cli"):
        return "cli"
    return "core"


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    modules = {m for m in found if m.startswith("draftwise.")}
    return {m for m in modules if _exists(m)}


def _exists(module: str) -> bool:
    path = ROOT.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


SOURCES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_layer_above_its_own(path):
    me = module_name(path)
    mine = LAYERS.index(layer_of(me))
    upward = sorted(m for m in imports(path) if LAYERS.index(layer_of(m)) > mine)
    assert not upward, f"{me} ({layer_of(me)}) imports {upward}"
    role = me.split(".")[1] if me.count(".") else ""
    if layer_of(me) == "core" and role in CORE_FORBIDDEN:
        crossing = sorted(m for m in imports(path) if m.split(".")[1] in CORE_FORBIDDEN[role])
        assert not crossing, f"{me} imports {crossing}"


def test_top_level_imports_form_no_cycle():
    graph = {module_name(p): {m for m in imports(p, top_level_only=True) if m != module_name(p)} for p in SOURCES}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_checker_catches_a_planted_upward_import(tmp_path):
    planted = tmp_path / "engine.py"
    planted.write_text("def f():\n    from draftwise.optimize.auto import auto_tree\n")
    upward = [m for m in imports(planted) if LAYERS.index(layer_of(m)) > LAYERS.index("core")]
    assert upward == ["draftwise.optimize.auto", "draftwise.optimize.auto.auto_tree"][:len(upward)] and upward
