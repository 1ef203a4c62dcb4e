"""Data files shipped inside the package (read with importlib.resources, never by a path
relative to the checkout).

    spec_bench/question.jsonl   Spec-Bench development split (240 questions, 13 categories),
                                Apache-2.0: see spec_bench/NOTICE, LICENSE and README.md
    calibration/chat.jsonl      three everyday chat requests written for draftwise (the
                                `chat-calibration` workload): with HumanEval 0-1, the prompts
                                the automatic choices calibrate on; in no benchmark workload
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

SPEC_BENCH_DEV = "spec-bench"  # the workload / eval-set name that stands for the packaged split
CHAT_CALIBRATION = "chat-calibration"  # the workload name of the packaged chat calibration prompts


def spec_bench_questions() -> Path:
    """Path of the packaged Spec-Bench development split `question.jsonl`.

    Package data installed by setuptools (wheel or editable) or read from a checkout is a plain
    file on disk; a zip import (which draftwise is never installed as) is refused.
    """
    resource = files(__name__).joinpath("spec_bench", "question.jsonl")
    if not isinstance(resource, Path):
        raise RuntimeError(f"draftwise's packaged data is not a file on disk ({resource!r})")
    return resource


def chat_calibration_prompts() -> Path:
    """Path of the packaged chat calibration prompts (JSONL of {"prompt": ...})."""
    resource = files(__name__).joinpath("calibration", "chat.jsonl")
    if not isinstance(resource, Path):
        raise RuntimeError(f"draftwise's packaged data is not a file on disk ({resource!r})")
    return resource
