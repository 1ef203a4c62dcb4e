"""Whether a user's string names a file or a directory, asked without raising.

`Path.is_dir()` / `is_file()` answer False for a missing path, but raise OSError for a name the
system refuses outright (longer than NAME_MAX: a tree template or a prompt given where a path
was possible).  Every option that may be a path asks here, so such a string is simply not a
path and the option's own parser says what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path


def is_dir(text: str | Path) -> bool:
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):  # ENAMETOOLONG and the like; ValueError: an embedded NUL
        return False


def is_file(text: str | Path) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False
