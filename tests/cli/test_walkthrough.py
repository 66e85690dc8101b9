"""The README's main job, end to end: the walkthrough script with the real engines on the shipped model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from invar.engines import REPO_ROOT
from invar.records import RunStore

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_walkthrough_runs_every_step_and_keeps_verifiable_records(tmp_path: Path) -> None:
    out = tmp_path / "walk"
    env = dict(os.environ, INVAR_WALKTHROUGH_OUT=str(out),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "walkthrough.sh")], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in range(1, 8):
        assert f"== {step}." in proc.stdout
    for run in ("infer-hf", "infer-vllm", "eval-fp32", "eval-nf4"):
        with RunStore.open(out / run) as store:
            v = store.verify()
            assert v.calls == v.reports > 0
            assert v.errors == 0
    contract = json.loads((out / "arith-nf4.contract.json").read_text())
    assert contract["requirement"]["method"] == "paired-binary-exact"
    assert "paired-binary-exact" in proc.stdout
