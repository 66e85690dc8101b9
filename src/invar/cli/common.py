"""Option aliases and output helpers shared by every command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts and agents).")]
RunDir = Annotated[Path, typer.Argument(help="A run directory (holds records.sqlite).")]
ExpectHeadOpt = Annotated[
    str | None,
    typer.Option("--expect-head", help="The run's chain head kept when it closed: refuse records that do not end "
                                       "there (re-chained, cut or extended)."),
]


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
