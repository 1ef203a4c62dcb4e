"""Where a head family finds its heads when none are named: the sets shipped inside the
package (`draftwise/data/heads/<family>-<model>/`), then the sets `draftwise heads train`
wrote into the cache (`<cache>/heads/<family>-<checkpoint>/`), each found by the family and
the target checkpoint its manifest is bound to."""

from __future__ import annotations

import json
from pathlib import Path

from draftwise.errors import InputError

from draftwise.models import cache_dir

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "heads"


def trained_root() -> Path:
    return cache_dir().parent / "heads"


def trained_path(family: str, checkpoint: str) -> Path:
    """Where `draftwise heads train` writes a set by default."""
    return trained_root() / f"{family}-{checkpoint.replace('@', '-')}"


def shipped_heads(root: Path = SHIPPED) -> list[tuple[str, str, Path]]:
    """(family, target checkpoint, directory) of every head set under `root` (manifests read, not verified)."""
    found = []
    for manifest in sorted(root.glob("*/manifest.json")):
        try:
            provenance = json.loads(manifest.read_text())["provenance"]
            found.append((str(provenance["family"]), str(provenance["target"]["checkpoint"]), manifest.parent))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # load_heads reports a broken artifact when it is asked for by path
    return found


def default_heads(family: str, checkpoint: str) -> Path:
    for name, target, directory in [*shipped_heads(), *shipped_heads(trained_root())]:
        if name == family and target == checkpoint:
            return directory
    raise InputError(f"no {family} heads ship for {checkpoint}; train a set (draftwise heads train --family {family} "
                     f"--target MODEL --out DIR) and pass heads=DIR")
