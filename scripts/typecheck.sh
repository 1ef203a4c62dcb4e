#!/usr/bin/env bash
# mypy, strict on the runtime core (pyproject's [[tool.mypy.overrides]] lists the modules);
# the modules they import are read for their types, not checked here.
set -euo pipefail
cd "$(dirname "$0")/../src"
modules=$(../.venv/bin/python - <<'PY'
import tomllib
config = tomllib.load(open("../pyproject.toml", "rb"))
strict = next(o for o in config["tool"]["mypy"]["overrides"] if o.get("strict"))
print(" ".join(f"-p {m.removesuffix('.*')}" for m in strict["module"]))
PY
)
# shellcheck disable=SC2086
../.venv/bin/mypy --follow-imports=silent $modules
