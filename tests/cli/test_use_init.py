"""`invar use init` writes a declaration `use prepare` accepts as written: every digest filled in, each package's
identity as its worker reports it, paths relative to the file; bad options are one line before anything is written
or any worker starts (issue 27)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.cli_batch import InvarSession
from typer.testing import CliRunner

from invar import canonical
from invar.cli.app import app
from invar.engines import DEFAULT_MODEL, worker_digest
from invar.errors import InvarError

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_BOUND_S = 300  # seconds a command may take in the module's session (tests/cli/conftest.py)




@pytest.mark.engine
def test_a_new_declaration_goes_through_prepare_run_and_admit_with_no_edit(cli: InvarSession, tmp_path: Path) -> None:
    """On the shipped model: init (the candidate on NF4 weights, 16 units, no invariance layouts), then prepare, run
    and admit, each on the file as init wrote it, from the declaration's own folder."""
    where = tmp_path / "owner" / "uses"
    where.mkdir(parents=True)
    made = cli.run("use", "init", where / "nf4.toml", "--candidate-quantization", "nf4", "--sample", "16",
                   "--no-invariance", "--epsilon", "0.5", "--party", "the test", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (where / "nf4.toml").read_text(encoding="utf-8")
    decl = tomllib.loads(text)
    # Every digest is the files' own, and every path is relative to the declaration's folder.
    assert decl["population"]["sha256"] == canonical.file_sha256(REPO_ROOT / "data" / "arith-eval.jsonl")
    for role in ("reference", "candidate"):
        package = decl[role]
        assert not Path(package["model_dir"]).is_absolute()
        assert (where / package["model_dir"]).resolve() == DEFAULT_MODEL.resolve()
        assert package["model_digest"] == canonical.tree_digest(DEFAULT_MODEL)
        assert package["settings"]["threads"] == 1
        assert "invar" in package["engine_version"]
        assert package["worker_digest"] == worker_digest("hf")
    assert decl["candidate"]["quantization"] == "nf4"
    assert decl["reference"]["quantization"] == "none"
    assert decl["premises"][0]["party"] == "the test"
    assert "# ε: the largest allowed rise of the mean task loss" in text  # each field says what it decides
    prepared = cli.run("use", "prepare", "nf4.toml", "--json", cwd=where)
    assert prepared.returncode == 0, prepared.stderr
    assert json.loads(prepared.stdout)["units"] == 16
    ran = cli.run("use", "run", "nf4.contract.json", "--run", "run", cwd=where)
    assert ran.returncode == 0, ran.stderr
    admitted = cli.run("use", "admit", "run", "--contract", "nf4.contract.json", "--json", cwd=where)
    assert json.loads(admitted.stdout)["answer"] in ("Admitted", "Violated", "Unknown"), admitted.stderr
    assert admitted.returncode in (0, 10, 11)
    assert json.loads(admitted.stdout)["task_loss"]["n"] == 16


def _no_worker(*_: object, **__: object) -> object:
    raise AssertionError("a worker was started for options that are refused")


@pytest.mark.parametrize(("args", "says"), [
    (["--epsilon", "1.5"], "requirement.epsilon"),
    (["--epsilon", "abc"], "--epsilon"),
    (["--confidence", "1"], "--confidence"),
    (["--setting", "threads=abc"], "threads takes an integer"),
    (["--candidate-setting", "speed=1"], "no launch setting 'speed'"),
    (["--candidate-patch", "no-such-patch"], "unknown patch"),
    (["--scorer", "no-such-scorer"], "no-such-scorer"),
    (["--method", "median"], "--method"),
    (["--sample", "0"], "--sample"),
    (["--sample", "30000"], "--sample"),
    (["--standard", "both"], "--standard"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--batch-size", "0"], "--batch-size"),
    (["--name", "Has Spaces"], "--name"),
    (["--model", "no/such/folder"], "--model"),
    (["--population", "no/such.jsonl"], "--population"),
    (["--sequential", "--invariance"], "--sequential"),
    (["--every-unit", "--sample", "5"], "--every-unit"),
    (["--candidate-quantization", "none"], "--candidate-quantization"),  # the candidate would be the reference
])
def test_bad_options_are_one_line_before_any_worker_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str) -> None:
    monkeypatch.setattr("invar.runner.engine.probe_identity", _no_worker)
    out = tmp_path / "decl.toml"
    result = CliRunner().invoke(app, ["use", "init", str(out), "--candidate-quantization", "nf4", *args])
    assert isinstance(result.exception, InvarError), (result.output, result.exception)
    message = str(result.exception)
    assert "\n" not in message, message
    assert says in message, message
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_kept_unless_force_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "decl.toml"
    out.write_text("mine\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["use", "init", str(out)])
    assert isinstance(result.exception, InvarError)
    assert "--force" in str(result.exception)
    assert out.read_text(encoding="utf-8") == "mine\n"

    identity = SimpleNamespace(engine_version={"invar": "0.1.0", "torch": "2"},
                               settings={"attn_implementation": "sdpa", "device": "cpu", "threads": 1})
    started: list[object] = []
    monkeypatch.setattr("invar.runner.engine.probe_identity", lambda *a: started.append(a) or identity)
    result = CliRunner().invoke(app, ["use", "init", str(out), "--force", "--candidate-patch", "fixed-block",
                                      "--candidate-setting", "attn_implementation=eager"])
    assert result.exit_code == 0, (result.output, result.exception)
    decl = tomllib.loads(out.read_text(encoding="utf-8"))
    assert decl["candidate"]["patches"]["fixed-block"] == canonical.tree_digest(REPO_ROOT / "patches" / "fixed-block")
    # A patched candidate gets the kernel contract: determinism relative to the stock reference, no batch invariance.
    assert decl["invariance"] == {"required": False}
    assert decl["determinism"] == {"required": True, "layout": "b16", "runs": 2, "relative_to": "reference"}
    assert decl["population"]["sample"] == 2000
    assert decl["requirement"]["method"] == "paired-binary-score"
    assert len(started) == 2  # one worker per distinct identity: the candidate's launch and patch differ
