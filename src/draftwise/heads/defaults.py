"""Head sets shipped inside the package (`draftwise/data/heads/<family>-<model>/`): found by
the family and the target checkpoint their manifest is bound to."""

from __future__ import annotations

import json
from pathlib import Path

from draftwise.errors import InputError

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "heads"


def shipped_heads() -> list[tuple[str, str, Path]]:
    """(family, target checkpoint, directory) of every shipped head set (manifests read, not verified)."""
    found = []
    for manifest in sorted(SHIPPED.glob("*/manifest.json")):
        try:
            provenance = json.loads(manifest.read_text())["provenance"]
            found.append((str(provenance["family"]), str(provenance["target"]["checkpoint"]), manifest.parent))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # load_heads reports a broken artifact when it is asked for by path
    return found


def default_heads(family: str, checkpoint: str) -> Path:
    for name, target, directory in shipped_heads():
        if name == family and target == checkpoint:
            return directory
    raise InputError(f"no {family} heads ship for {checkpoint}; train a set (draftwise heads train --family {family} "
                     f"--target MODEL --out DIR) and pass heads=DIR")
