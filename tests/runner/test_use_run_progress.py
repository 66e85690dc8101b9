"""`use run` says what it is doing, on stderr: starting both packages' workers, loading the models, then the
requests and planned calls done, while `--json` stays one document on stdout (issue 27). `--quiet`: the error line
alone (test_use_run.py, a worker that is not the package)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_use_run import _invar, write_declaration

pytestmark = pytest.mark.engine

LINE = re.compile(r"invar: (?P<phase>.+)… \d+\.\d s")


def test_use_run_shows_its_phases_on_stderr_and_json_on_stdout(tmp_path: Path) -> None:
    decl = write_declaration(tmp_path, "progress-small", units=4, per_call=4)
    prepared = _invar("use", "prepare", str(decl))
    assert prepared.returncode == 0, prepared.stderr
    contract = tmp_path / "progress-small.contract.json"

    out = _invar("use", "run", str(contract), "--run", str(tmp_path / "run"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["calls_issued"] == 3
    shown = [LINE.fullmatch(line) for line in out.stderr.splitlines()]
    assert all(shown), out.stderr
    phases = [m["phase"] for m in shown if m is not None]
    assert phases[:2] == ["starting workers (hf reference, hf candidate)", "loading the models"]
    # One package may answer its first call while the other still loads: the count starts where it is.
    assert re.fullmatch(r"generating \d+/12 requests", phases[2]), phases
    assert phases[-1] == "generating 12/12 requests (3/3 calls)"
