"""`use admit` says what it is doing, on stderr: reading the contract's inputs, verifying the records call by call
(each bound and scored as it is read: one pass, issue 49), scoring the losses, deciding, writing the receipt, each
with the time since the command started (issue 27); `--quiet` shows none of it, and stdout (the decision, or its one
`--json` document) is the same either way. Admission itself only calls its `progress` parameter: the decision does
not depend on it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids
from support.cli_batch import InvarSession

from invar.contract.admit import Step, admit

LINE = re.compile(r"invar: (?P<phase>.+)… (?P<elapsed>\d+\.\d) s")
# The run's 5 calls: each package's load_model, and the 3 planned generate calls.
PHASES = ["reading the contract's inputs", "verifying the records 0/5 calls", "verifying the records 5/5 calls",
          "scoring the losses", "deciding"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("progress"), units=60)


@pytest.fixture(scope="module")
def run(ws: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return RunWriter(ws, tmp_path_factory.mktemp("run") / "run").complete(
        candidate_wrong=unit_ids(ws, 20)).close()


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=300) as session:
        yield session


def _phases(stderr: str) -> list[str]:
    """The phases shown, in order, with the elapsed time never going back; every line must be a phase line."""
    matches = [LINE.fullmatch(line) for line in stderr.splitlines()]
    assert all(matches), stderr
    elapsed = [float(m["elapsed"]) for m in matches if m is not None]
    assert elapsed == sorted(elapsed)
    return [m["phase"] for m in matches if m is not None]


def test_admission_tells_its_phases_in_order_and_decides_the_same(ws: Workspace, run: Path) -> None:
    steps: list[Step] = []
    told = admit(ws.contract_path, run, progress=steps.append)
    assert [s.phase for s in steps] == ["reading the contract's inputs"] + ["verifying the records"] * 6 + [
        "scoring the losses", "deciding"]
    assert [(s.done, s.total) for s in steps[1:7]] == [(k, 5) for k in range(6)]
    assert all(s.done is None and s.total is None for s in steps[:1] + steps[7:])
    assert told.output() == admit(ws.contract_path, run).output()


def test_use_admit_shows_its_phases_on_stderr_and_quiet_shows_none(cli: InvarSession, run: Path, ws: Workspace,
                                                                   tmp_path: Path) -> None:
    shown = cli.run("use", "admit", run, "--contract", ws.contract_path, "--json")
    quiet = cli.run("use", "admit", run, "--contract", ws.contract_path, "--json", "--quiet")
    # Unknown: 20 of 60 units worse, too few units for the bound to place the change on either side of ε.
    assert shown.returncode == quiet.returncode == 11, shown.stderr
    assert _phases(shown.stderr) == PHASES
    assert quiet.stderr == ""
    assert shown.stdout == quiet.stdout
    assert json.loads(shown.stdout)["answer"] == "Unknown"  # one document

    text = cli.run("use", "admit", run, "--contract", ws.contract_path, "--receipt", tmp_path / "receipt.json")
    assert text.returncode == 11
    assert _phases(text.stderr) == [*PHASES, "writing the receipt"]
    assert text.stdout.startswith("Unknown: ")
    assert (tmp_path / "receipt.json").is_file()


def test_a_refusal_is_the_last_line_after_the_phases_and_the_only_line_when_quiet(
        cli: InvarSession, ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    writer.worker("reference")
    refused = writer.close()  # the reference's load_model alone: no planned call is on record
    out = cli.run("use", "admit", refused, "--contract", ws.contract_path)
    assert out.returncode == 2
    *phases, error = out.stderr.splitlines()
    assert _phases("\n".join(phases)) == ["reading the contract's inputs", "verifying the records 0/1 calls",
                                          "verifying the records 1/1 calls"]
    assert error.startswith("invar: error: ")
    assert "planned call reference/solo" in error
    quiet = cli.run("use", "admit", refused, "--contract", ws.contract_path, "--quiet")
    assert quiet.returncode == 2
    assert quiet.stderr == error + "\n"


def test_use_verify_shows_the_recomputation_and_quiet_shows_none(cli: InvarSession, run: Path, ws: Workspace,
                                                                 tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    assert cli.run("use", "admit", run, "--contract", ws.contract_path, "--receipt", receipt,
                   "--quiet").returncode == 11
    args = ("use", "verify", receipt, "--run", run, "--contract", ws.contract_path, "--trust-embedded-key", "--json")
    shown, quiet = cli.run(*args), cli.run(*args, "--quiet")
    assert shown.returncode == quiet.returncode == 0, shown.stderr
    assert _phases(shown.stderr) == PHASES
    assert quiet.stderr == ""
    assert shown.stdout == quiet.stdout
    assert json.loads(shown.stdout)["verified"] is True


def test_compare_numerical_of_a_use_run_shows_its_parts_then_admissions(cli: InvarSession, run: Path,
                                                                      ws: Workspace, tmp_path: Path) -> None:
    args = ("compare", "numerical", run, "--contract", ws.contract_path, "--json")
    shown, quiet = cli.run(*args), cli.run(*args, "--quiet")
    assert shown.returncode == quiet.returncode == 0, shown.stderr
    # The records are verified, bound and scored in one pass (as admission's), so scoring is no phase of its own.
    assert _phases(shown.stderr) == ["reading the contract's inputs", "reading the run's records under the contract",
                                     "comparing the numbers", *PHASES]
    assert quiet.stderr == ""
    assert shown.stdout == quiet.stdout
    assert json.loads(shown.stdout)["decision"]["answer"] == "Unknown"
