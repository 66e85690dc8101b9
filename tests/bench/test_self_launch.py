"""Bench scripts that start copies of themselves as `python -P FILE` (a wrapped worker, a direct runner: -P, as the
core starts its workers, puts no script folder on the path) import their bench helpers all the same. A helper found
only through the script's own folder left bench/train_cost_breakdown.py's wrapped workers dying at the handshake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["train_cost_breakdown.py", "train_overhead.py", "overhead.py"])
def test_the_script_starts_under_dash_p(script: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-P", str(ROOT / "bench" / script), "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
