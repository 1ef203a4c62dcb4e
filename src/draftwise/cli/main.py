"""The `draftwise` command: one typer app, one sub-app or command per module of this package.

Each command module imports only what its command needs; this module only wires them.
"""

from __future__ import annotations

import typer

from draftwise.cli.bench import bench_app
from draftwise.cli.export import export_app
from draftwise.cli.generate import generate, proposers
from draftwise.cli.heads import heads_app
from draftwise.cli.index import index_app
from draftwise.cli.models import models_app
from draftwise.cli.profile import oracle, profile
from draftwise.cli.selfdraft import adapter_app, skip_app
from draftwise.cli.serve import serve
from draftwise.cli.tree import calibrate, tree_app

app = typer.Typer(help="Exact speculative decoding, chosen by measured time per committed token.", no_args_is_help=True)
app.command()(generate)
app.command()(proposers)
app.add_typer(models_app, name="models")
app.command()(oracle)
app.command()(profile)
app.add_typer(index_app, name="index")
app.add_typer(heads_app, name="heads")
app.add_typer(skip_app, name="skip")
app.add_typer(adapter_app, name="adapter")
app.add_typer(tree_app, name="tree")
app.command()(calibrate)
app.add_typer(bench_app, name="bench")
app.add_typer(export_app, name="export")
app.command()(serve)

if __name__ == "__main__":
    app()
