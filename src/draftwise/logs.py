"""Where the library's progress lines go.  Modules log to `logging.getLogger(__name__)` at INFO
(a model pulled, a profile measured, a tree optimized, traces decoded); a front end shows them
for the duration of one command with `progress_to(show)`, and a Python user configures the
`draftwise` logger as for any library (silent by default: Python shows WARNING and above)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator

LOGGER = "draftwise"


class _Forward(logging.Handler):
    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._show = show

    def emit(self, record: logging.LogRecord) -> None:
        self._show(record.getMessage())


@contextmanager
def progress_to(show: Callable[[str], None] | None) -> Iterator[None]:
    """Within the block, every INFO line of the `draftwise` loggers goes to `show` (None: nowhere)."""
    if show is None:
        yield
        return
    logger = logging.getLogger(LOGGER)
    handler, level = _Forward(show), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
