"""`invar use prepare | plan | admit` through typer: output, JSON, and one exit code per answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids
from typer.testing import CliRunner

from invar.cli import use
from invar.errors import ContractError, EvidenceError, InvarError

RUNNER = CliRunner()


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("cli"), units=600)


def test_prepare_prints_the_sha256_and_the_plan(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    result = RUNNER.invoke(use.app, ["prepare", str(tmp_path / "decl.toml")])
    assert result.exit_code == 0, result.output
    first, second, *calls = result.output.splitlines()
    assert first == f"{ws.sha256}  {ws.contract_path}"
    assert second == "plan invar.plan/2: 30 units, 3 generate calls"
    assert [line.split()[:2] for line in calls] == [["reference/solo", "1"], ["candidate/solo", "1"],
                                                    ["candidate/b4r", "1"]]
    doc = json.loads(RUNNER.invoke(use.app, ["prepare", str(tmp_path / "decl.toml"), "--json"]).output)
    assert doc["sha256"] == ws.sha256
    assert doc["units"] == 30


def test_prepare_bad_declaration_raises_one_line(tmp_path: Path) -> None:
    (tmp_path / "decl.toml").write_text('name = "x"\n')
    result = RUNNER.invoke(use.app, ["prepare", str(tmp_path / "decl.toml")])
    assert isinstance(result.exception, ContractError)
    assert str(result.exception).endswith("population: is required; add it (and 8 more problems)")


@pytest.mark.parametrize(("wrong", "answer", "code"), [(0, "Admitted", 0), (150, "Violated", 10), (30, "Unknown", 11)])
def test_admit_exit_code_per_answer(ws: Workspace, tmp_path: Path, wrong: int, answer: str, code: int) -> None:
    run = RunWriter(ws, tmp_path / "run").complete(candidate_wrong=unit_ids(ws, wrong)).close()
    result = RUNNER.invoke(use.app, ["admit", str(run), "--contract", str(ws.contract_path), "--json"])
    assert result.exit_code == code, result.output
    doc = json.loads(result.stdout)  # the phases shown go to stderr
    assert doc["answer"] == answer
    assert doc["exit_code"] == code
    text = RUNNER.invoke(use.app, ["admit", str(run), "--contract", str(ws.contract_path)])
    assert text.exit_code == code
    assert text.stdout.startswith(f"{answer}: ")
    assert "bound      maurer-pontil maurer-pontil/1, δ = 0.05" in text.stdout
    assert "diagnostic (never deciding) paired Wald" in text.stdout


def test_admit_refused_evidence_raises(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    writer.worker("reference")
    run = writer.close()
    result = RUNNER.invoke(use.app, ["admit", str(run), "--contract", str(ws.contract_path)])
    assert isinstance(result.exception, EvidenceError)
    assert "planned call reference/solo" in str(result.exception)


def test_plan_table_and_json(ws: Workspace) -> None:
    args = ["plan", str(ws.contract_path), "--assume", "worse=0.01 better=0.01", "--method", "maurer-pontil"]
    result = RUNNER.invoke(use.app, args)
    assert result.exit_code == 0, result.output
    assert "maurer-pontil/1" in result.output
    lines = result.output.rstrip().splitlines()
    assert lines[-2] == "the contract decides with maurer-pontil and runs 600 units"
    # then the power the contract's own n reaches under the assumption (a warning when it is below the target)
    assert lines[-1].startswith("at its 600 units maurer-pontil admits with probability 0.8"), lines[-1]
    doc = json.loads(RUNNER.invoke(use.app, [*args, "--json"]).output)
    (row,) = doc["rows"]
    assert row["method"] == "maurer-pontil"
    assert row["n"] == 589  # 0/1 losses, p_worse = p_better = 0.01, ε = δ = 0.05, power 0.8: exact
    assert doc["epsilon"] == "0.05"


def test_plan_rejects_unknown_assumption(ws: Workspace) -> None:
    result = RUNNER.invoke(use.app, ["plan", str(ws.contract_path), "--assume", "sigma=2"])
    assert isinstance(result.exception, InvarError)  # main() prints it as one line and exits 2
    assert str(result.exception) == "--assume: 'sigma' is not an assumption; use worse, better, variance, mean"
    result = RUNNER.invoke(use.app, ["plan", str(ws.contract_path), "--assume", "worse 0.01"])
    assert str(result.exception) == "--assume 'worse 0.01': write name=value pairs, e.g. worse=0.01 better=0.01"


def test_plan_refuses_a_finite_domain_contract(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30, requirement={"standard": "finite-domain", "confidence": None,
                                                         "method": None})
    result = RUNNER.invoke(use.app, ["plan", str(ws.contract_path), "--assume", "worse=0.01 better=0.01"])
    assert isinstance(result.exception, ContractError)
    assert "no sample size to plan" in str(result.exception)


def test_plan_shows_its_progress_only_when_it_takes_long(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that ends within PLAN_QUIET_S prints only its table; one that takes longer shows on stderr each
    method's n as it is ready (forced here by a zero wait), and --quiet shows nothing."""
    args = ["plan", str(ws.contract_path), "--assume", "worse=0.01 better=0.01", "--method", "maurer-pontil"]
    quick = RUNNER.invoke(use.app, args)
    assert quick.exit_code == 0
    assert quick.stderr == ""
    monkeypatch.setattr(use, "PLAN_QUIET_S", 0.0)
    slow = RUNNER.invoke(use.app, args)
    assert slow.exit_code == 0
    lines = slow.stderr.splitlines()
    assert lines[0].startswith("invar: planning the sample size 0/1 methods… ")
    assert lines[-1].startswith("invar: planning the sample size 1/1 methods (maurer-pontil: 589 units)… ")
    assert slow.stdout == quick.stdout
    assert RUNNER.invoke(use.app, [*args, "--quiet"]).stderr == ""


def test_plan_refuses_a_bad_sequential_max_before_showing_progress(ws: Workspace,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An option planning cannot take is refused before the planning starts: its line is the only one on stderr,
    even when progress would show at once."""
    monkeypatch.setattr(use, "PLAN_QUIET_S", 0.0)
    for extra, words in ((["--sequential-max", str(10**30)], "at most 16,777,216 units"),
                         (["--assume", "variance=0.02", "--sequential-max", "100"], "--sequential-max plans 0/1")):
        assume = [] if "--assume" in extra else ["--assume", "worse=0.01 better=0.01"]
        result = RUNNER.invoke(use.app, ["plan", str(ws.contract_path), *assume, *extra])
        assert isinstance(result.exception, InvarError)
        assert words in str(result.exception)
        assert result.stderr == ""  # main() prints the error line; nothing before it
