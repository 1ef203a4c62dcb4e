"""Exhaustive oracles: exact checks of the verifiers' math, run by `draftwise oracle`.

Importing this package imports every oracle module, which registers its oracles.
"""

from draftwise.oracles import hardware_tree, multi_candidate  # noqa: F401  (register on import)
from draftwise.oracles.registry import ORACLES, OracleResult, register, run_all

__all__ = ["ORACLES", "OracleResult", "register", "run_all"]
