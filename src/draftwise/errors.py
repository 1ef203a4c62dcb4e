"""One root for every error draftwise raises on purpose, with a subclass per area.

The CLI prints a `DraftwiseError` as one line and exits 2; anything else is a bug and keeps
its traceback.  Each area class also derives from the builtin a caller would have caught
before (ValueError for bad input, RuntimeError for a failed operation), so `except
ValueError` around a call keeps working.
"""

from __future__ import annotations


class DraftwiseError(Exception):
    """Something the user can fix: bad input, a refused pairing, a missing or foreign artifact."""


class InputError(DraftwiseError, ValueError):
    """An option, spec, policy, template, workload or prompt that cannot be used as given."""


class ContractError(DraftwiseError, ValueError):
    """A proposal, manifest or pairing breaks a declared contract."""


class ArtifactError(DraftwiseError, ValueError):
    """An artifact directory that is missing, corrupt, tampered or made for something else."""


class ModelError(DraftwiseError, ValueError):
    """A model that cannot be resolved, fetched or verified."""


class BackendError(DraftwiseError, RuntimeError):
    """A backend refused an operation (context overflow, budget exceeded, bad state)."""
