"""Option aliases and output helpers shared by every command."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from invar.errors import InvarError
from invar.records.store import is_run

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts and agents).")]
RunDir = Annotated[Path, typer.Argument(help="A run directory (holds records.sqlite).")]
ExpectHeadOpt = Annotated[
    str | None,
    typer.Option("--expect-head", help="The run's chain head kept when it closed: refuse records that do not end "
                                       "there (re-chained, cut or extended)."),
]


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def resumable(run_dir: Path, command: str) -> Iterator[None]:
    """A failure of a resumable command (`use run`, `train`) after its run exists says how to resume it."""
    try:
        yield
    except InvarError as exc:
        if not is_run(run_dir):
            raise
        raise InvarError(f"{exc}. Every record so far is kept in {run_dir}; resume with: {command} --run {run_dir}")\
            from None
