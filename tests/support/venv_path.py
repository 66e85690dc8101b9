"""The search path of commands a test runs through a shell script: this interpreter's folder first, so `invar` is
the checkout's."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def with_venv_bin(path: str | None = None) -> str:
    """`path` (this process's PATH by default) with this interpreter's folder first, added only where it is not first
    already: the test lanes put it first for the whole suite, so a worker such a command starts has the same PATH as
    the fork servers' and is forked, not refused."""
    path = os.environ.get("PATH", "") if path is None else path
    folder = str(Path(sys.executable).parent)
    if path.split(os.pathsep)[0] == folder:
        return path
    return f"{folder}{os.pathsep}{path}" if path else folder
