"""Every benchmark script imports: a script whose imports went stale with a library change
(tree_grid's `relation_for` moved to optimize/calibrate.py) fails here, not hours into a run."""

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[2] / "benchmarks").rglob("*.py"))


def test_the_benchmark_scripts_are_found():
    assert {p.name for p in SCRIPTS} >= {"run_grid.py", "predict_vs_measured.py", "plot_grid.py", "bench_index.py"}


def load(script: Path):
    """The script as a module: its imports and definitions run; `main()` is behind __name__ == "__main__"."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_benchmark_script_imports(script):
    assert callable(getattr(load(script), "main", None))


def test_grid_points_are_the_ungated_prompt_lookup_methods_with_their_size_and_depth():
    plot_grid = load(next(p for p in SCRIPTS if p.name == "plot_grid.py"))
    run = {"target": "smollm2-135m", "draft": None,
           "methods": ["plain=dw:proposer=none", "g=dw:proposer=prompt-lookup,gate=auto",
                       "a=dw:proposer=prompt-lookup,lookup=4,candidates=2", "b=dw:proposer=prompt-lookup,lookup=2"]}
    predictions = {"methods": [{"method": name, "predicted_speedup": 1.0, "measured_speedup": 1.0}
                               for name in ("plain", "g", "a", "b")]}
    points = {p["method"]: (p["n"], p["d"]) for p in plot_grid.grid_points(run, predictions)}
    assert points == {"a": (1 + 4 * 2, 4), "b": (1 + 2 * 1, 2)}  # plain and the gated method are no grid points
