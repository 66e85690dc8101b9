"""scripts/paired_accuracy.py pairs two `invar evaluate` runs problem by problem, re-scoring every reply from the
records with the scorer each run recorded (any task, not only arithmetic), and refuses runs that are not paired."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_runs import invar

pytestmark = [pytest.mark.engine]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "paired_accuracy.py"


def paired(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--json"], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, object]]]:
    folder = tmp_path_factory.mktemp("paired")
    made = {}
    for name, scorer in (("exact", ["--scorer", "arithmetic-exact"]), ("numeric", ["--scorer", "numeric"])):
        run = folder / name
        done = invar("evaluate", "--count", "48", "--seed", "3", *scorer, "--run", run, "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        made[name] = (run, json.loads(done.stdout))
    return made


@pytest.mark.parametrize("name", ["exact", "numeric"])
def test_a_run_paired_with_itself_counts_what_evaluate_counted(runs: dict[str, tuple[Path, dict[str, object]]],
                                                               name: str) -> None:
    run, result = runs[name]
    done = paired(run, run)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert rows["all"]["n"] == 48
    assert rows["all"]["better"] == rows["all"]["worse"] == 0
    assert rows["all"]["p_value"] == 1.0
    # Re-scored from the records with the recorded scorer: the same counts the command reported, kind by kind.
    assert rows["all"]["base_correct"] == result["correct"]
    by_kind = result["by_kind"]
    assert isinstance(by_kind, dict)
    assert {k: r["base_correct"] for k, r in rows.items() if k != "all"} == {
        k: v["correct"] for k, v in by_kind.items()}


def test_runs_scored_by_different_scorers_are_not_paired(runs: dict[str, tuple[Path, dict[str, object]]]) -> None:
    done = paired(runs["exact"][0], runs["numeric"][0])
    assert done.returncode != 0
    assert "the runs differ in scorer" in done.stderr
