"""The command line: `draftwise` (see `draftwise.cli.main`), one module per command group."""

from draftwise.cli.main import app

__all__ = ["app"]
