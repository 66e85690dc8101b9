"""Long commands say what they are doing, on stderr only: the phase (starting the worker, loading the model,
generating k/n, …) with the time since the command started; `--quiet` shows none of it, and `--json` output on
stdout stays one document (issue 27)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli_batch import InvarSession

from invar.cli import progress
from invar.cli.progress import Reporter
from invar.cli.train import _progress as train_progress
from invar.runner.train import Progress as TrainProgress

LINE = re.compile(r"invar: (?P<phase>.+)… (?P<elapsed>\d+\.\d) s")
CLI_BOUND_S = 600  # seconds a command may take in the module's session (tests/cli/conftest.py)


def phases(stderr: str) -> list[str]:
    """The phases a command showed, in order; every stderr line must be a phase line."""
    shown = []
    for line in stderr.splitlines():
        match = LINE.fullmatch(line)
        assert match is not None, f"not a phase line: {line!r}"
        shown.append(match["phase"])
    elapsed = [float(m["elapsed"]) for m in map(LINE.fullmatch, stderr.splitlines()) if m is not None]
    assert elapsed == sorted(elapsed)
    return shown


def test_off_a_terminal_each_phase_is_one_line_and_a_count_shows_its_end(capsys: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 3600.0)
    with Reporter() as shown:
        shown.phase("starting the hf worker")
        shown.phase("starting the hf worker")  # told again by another thread: shown once
        shown.phase("generating", total=3, unit="units")
        for done in (1, 2, 3):
            shown.count(done)
    out = capsys.readouterr()
    assert out.out == ""
    assert phases(out.err) == ["starting the hf worker", "generating 0/3 units", "generating 3/3 units"]


def test_quiet_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with Reporter(quiet=True) as shown:
        shown.phase("loading the model")
        shown.phase("generating", total=2)
        shown.count(2)
    assert capsys.readouterr() == ("", "")


def test_train_shows_the_cycle_and_its_phase_with_the_last_reward(capsys: pytest.CaptureFixture[str]) -> None:
    with Reporter() as shown:
        show = train_progress(shown)
        show(TrainProgress(0, 2, "start"))
        show(TrainProgress(0, 2, "generate"))
        show(TrainProgress(0, 2, "learn"))
        show(TrainProgress(1, 2, "generate", reward=0.5, gap_max=1e-7))
        show(TrainProgress(2, 2, "done", reward=0.75, gap_max=0.0))
    assert phases(capsys.readouterr().err) == [
        "starting the inference and learner workers and loading the model",
        "generating (cycle 1 of 2)", "learning (cycle 1 of 2)",
        "generating (cycle 2 of 2; cycle 1 reward 0.500, gap max 1e-07)"]


@pytest.mark.engine
def test_evaluate_infer_and_score_show_their_phases_on_stderr_and_quiet_shows_none(cli: InvarSession,
                                                                                   tmp_path: Path) -> None:
    run = tmp_path / "evaluate"
    out = cli.run("evaluate", "--count", "8", "--engine", "hf", "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["problems"] == 8
    assert phases(out.stderr) == ["starting the hf worker", "loading the model", "generating 0/8 units",
                                  "generating 8/8 units"]

    quiet = cli.run("evaluate", "--count", "8", "--engine", "hf", "--run", tmp_path / "quiet", "--json", "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    assert json.loads(quiet.stdout)["accuracy"] == json.loads(out.stdout)["accuracy"]

    scored = cli.run("score", "--from-run", run, "--run", tmp_path / "score", "--json")
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["items"]
    assert phases(scored.stderr) == ["starting the hf worker", "loading the model", "scoring 0/8 items",
                                     "scoring 8/8 items"]

    inferred = cli.run("infer", "12+7=", "--run", tmp_path / "infer", "--quiet")
    assert inferred.returncode == 0, inferred.stderr
    assert inferred.stderr == ""
    assert inferred.stdout.startswith("hf on ")
