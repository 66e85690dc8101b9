"""`use plan --sequential-max` shows its simulation as a count of runs once planning takes long."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract_runs import make_workspace
from typer.testing import CliRunner

from invar.cli import use
from invar.contract.sample_size import SEQUENTIAL_RUNS
from invar.stats import sequential

RUNNER = CliRunner()


def test_the_sequential_simulation_counts_its_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With progress forced at once and chunks of 200 runs (as at n_max 20,000), the simulation's lines count runs
    up to every run, and the plan printed is the one made without progress."""
    ws = make_workspace(tmp_path, units=600)
    args = ["plan", str(ws.contract_path), "--assume", "worse=0.01 better=0.01", "--method", "hoeffding",
            "--sequential-max", "2000"]
    monkeypatch.setattr(sequential, "CHUNK_UNITS", 200 * 2000)  # changes the runs: both plans below use it
    quiet = RUNNER.invoke(use.app, [*args, "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    monkeypatch.setattr(use, "PLAN_QUIET_S", 0.0)
    shown = RUNNER.invoke(use.app, args)
    assert shown.exit_code == 0, shown.output
    counted = [line for line in shown.stderr.splitlines()
               if line.startswith("invar: simulating sequential admission up to 2,000 units ")]
    assert counted[0].startswith("invar: simulating sequential admission up to 2,000 units 0/1000 runs… ")
    assert counted[-1].startswith(f"invar: simulating sequential admission up to 2,000 units "
                                  f"{SEQUENTIAL_RUNS}/{SEQUENTIAL_RUNS} runs… ")
    assert shown.stdout == quiet.stdout
