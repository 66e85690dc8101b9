"""What every benchmark's JSON shares: the command that made it and when (its first keys), and how it is written."""

from __future__ import annotations

import compileall
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def header(script: str, argv: Sequence[str] | None = None) -> dict[str, str]:
    """`command` (`bench/SCRIPT` and its arguments: `argv` where `main` was given them, else this process's) and
    `date_utc` (now, to the second): the keys that say how to make a bench's figures again."""
    args = sys.argv[1:] if argv is None else argv
    return {"command": f"bench/{script} " + " ".join(args),
            "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def write_json(path: Path | None, doc: Any, *, indent: int = 2, sort_keys: bool = False, say: bool = True) -> None:
    """Write `doc` to `path` as indented JSON and a newline, its folder made, and (`say`) print where; nothing where
    `path` is None (the bench was not asked for a file)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent, sort_keys=sort_keys) + "\n", encoding="utf-8")
    if say:
        print(f"JSON {path}")


def compile_sources(*trees: Path) -> None:
    """Write the bytecode of every module under each source tree before a bench times commands that import them.

    Why: an installed wheel carries its bytecode, and a checkout's is written on its first run, so a command a user
    runs reads compiled modules. Where `PYTHONDONTWRITEBYTECODE` is set (it is on this project's machines) nothing is
    ever written, and each timed command would compile the core's modules again (about 0.1 s of a 20,000-unit
    admission here, measured alternately with and without the bytecode).
    Reading bytecode is allowed with that setting; this writes it once (stale files are ignored by the interpreter,
    which checks each source's time and size)."""
    for tree in trees:
        compileall.compile_dir(str(tree), quiet=1)
