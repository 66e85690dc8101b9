"""The `invar` application: every command is registered here, and only commands that work are.

Known failures (`InvarError`) print one line naming what is wrong and what to change, and exit 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import sys

import typer

from invar import __version__
from invar.cli import compare, evaluate, infer, inspect, keys, score, train, use
from invar.errors import InvarError

app = typer.Typer(
    name="invar",
    help="Decide whether a changed numerical implementation may replace the trusted one, for a declared use.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(inspect.app, name="inspect")
app.add_typer(use.app, name="use")
app.add_typer(keys.app, name="keys")
app.add_typer(compare.app, name="compare")
app.command("infer")(infer.infer)
app.command("evaluate")(evaluate.evaluate)
app.command("score")(score.score)
app.command("train")(train.train)


@app.command("version")
def version() -> None:
    """Print the invar version."""
    typer.echo(__version__)


def main() -> None:
    try:
        app()
    except InvarError as exc:
        print(f"invar: error: {exc}", file=sys.stderr)
        sys.exit(2)
