"""What is measured on this machine and cached for the planner: verify-cost profiles, the llama.cpp
invariance probe, the transformers row-padding plan and the dtype choice; and `load_backend`
(`measure.load`), the loader that applies them."""

from __future__ import annotations

from pathlib import Path


def auto_cache_root() -> Path:
    """Where the measured `auto` choices are cached (beside the downloaded models)."""
    from draftwise.models import cache_dir

    return cache_dir().parent / "auto"
