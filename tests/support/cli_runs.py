"""What the end-to-end tests share: the `invar` command as a subprocess, several of them side by side, and a
package's lines of a declaration as `invar use package` states them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def invar(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`invar ARGS`, its output captured."""
    return subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def side_by_side(commands: Mapping[str, Sequence[str | Path]], logs: Path, timeout: float) -> dict[str, str]:
    """Start every `invar` command at once (a key names each), wait for all, and return each one's stdout; an exit
    other than 0 fails with the tail of its stderr. Stdout and stderr go to `logs`/KEY.log and KEY.err."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for key, args in commands.items():
            with (logs / f"{key}.log").open("wb") as stdout, (logs / f"{key}.err").open("wb") as stderr:
                procs[key] = subprocess.Popen([sys.executable, "-m", "invar.cli", *map(str, args)], stdout=stdout,
                                              stderr=stderr)
        for key, proc in procs.items():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            err = (logs / f"{key}.err").read_text(encoding="utf-8", errors="replace")
            assert proc.returncode == 0, f"{key} exited {proc.returncode}:\n{err[-4000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {key: (logs / f"{key}.log").read_text(encoding="utf-8") for key in commands}


def toml_value(v: Any) -> str:
    """A JSON value as a TOML inline value (tables inline, keys quoted; TOML has no null)."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in sorted(v.items())) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if v is None:
        raise ValueError("TOML has no null")
    return json.dumps(v)


def package_lines(engine: str, model: Path | str, timeout: float = 300) -> str:
    """The lines of a declaration's package section that `invar use package ENGINE --model MODEL` states: engine,
    engine_version, settings, model_dir and model_digest (the dtype and the rest are the caller's)."""
    shown = invar("use", "package", engine, "--model", model, "--json", timeout=timeout)
    assert shown.returncode == 0, shown.stderr
    pkg = json.loads(shown.stdout)
    return (f'engine = "{engine}"\nengine_version = {toml_value(pkg["engine_version"])}\n'
            f'settings = {toml_value(pkg["settings"])}\nmodel_dir = "{model}"\n'
            f'model_digest = "{pkg["model_digest"]}"\n')
