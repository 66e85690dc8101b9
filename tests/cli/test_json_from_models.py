"""Every command's `--json` is its output model's own serialisation (`emit_model`), not a dict built beside the
model: no command module writes through `emit_json`, and what each command prints is what its model in
`invar.cli.outputs` dumps (shown here with the engine's part scripted or served by the in-process fake worker;
`tests/cli/test_schemas.py` runs every command on a real engine and validates its output against the schema)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract.contract_runs import REFERENCE_IDENTITY, RunWriter, Workspace, make_workspace, unit_ids
from pydantic import BaseModel
from runner.train_helpers import write_config
from support.fake_worker import FakeTransport
from typer.testing import CliRunner

from invar.cli import outputs
from invar.cli.app import app
from invar.loop import history as loop_history
from invar.loop.config import read_config
from invar.loop.cycle import Gap, Importance
from invar.loop.history import CycleHistory, History
from invar.runner import engine, evaluate, score
from invar.runner import use_run as use_run_module
from invar.runner.train import Published, TrainOutcome
from invar.runner.use_run import RunOutcome, admit_command

CLI = Path(__file__).resolve().parents[2] / "src" / "invar" / "cli"
RUNNER = CliRunner()

COMMANDS = {
    ("app.py", "_print_versions"), ("infer.py", "infer"), ("evaluate.py", "evaluate"), ("score.py", "score"),
    ("train.py", "train"), ("inspect.py", "records"), ("history.py", "history"), ("use.py", "prepare_cmd"),
    ("use.py", "plan_cmd"), ("use.py", "package_cmd"), ("use.py", "run_cmd"), ("use.py", "admit_cmd"),
    ("use.py", "verify_cmd"), ("use.py", "prepare_imported_cmd"), ("use.py", "admit_imported_cmd"),
    ("keys.py", "new"), ("compare.py", "numerical"), ("compare.py", "histories"),
    ("imported.py", "summary_imported_cmd"), ("kernel.py", "check_cmd"),
}
"""Every command function with a `--json` (one per model in `invar.cli.outputs.OUTPUTS`)."""


def _emitters() -> Iterator[tuple[tuple[str, str], str, ast.Call]]:
    """((module file, function), called name, call) for each `emit_json`/`emit_model` call in the CLI's modules."""
    for path in sorted(CLI.glob("*.py")):
        if path.name == "common.py":  # the writers themselves
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("emit_json", "emit_model"):
                    yield (path.name, fn.name), node.func.id, node


def test_every_command_prints_its_model_and_none_a_dict() -> None:
    """`emit_json` of a dict built in a command would be a second spelling of its output beside the model."""
    calls = list(_emitters())
    assert [where for where, name, _ in calls if name == "emit_json"] == []
    assert {where for where, name, _ in calls if name == "emit_model"} == COMMANDS
    assert len(COMMANDS) == len(outputs.OUTPUTS)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("models"), units=30)


@pytest.fixture(scope="module")
def run(ws: Workspace) -> Path:
    return RunWriter(ws, ws.root / "run").complete(candidate_wrong=unit_ids(ws, 3)).close()


def _printed_by(model: type[BaseModel], *args: str | Path) -> dict[str, Any]:
    """The command's --json, with `model.model_dump` marking what it returns: the mark shows in the output only if
    the output is that dump. The rest must be what the model gives back when it reads the output again."""
    original = model.model_dump

    def dump(self: BaseModel, **kwargs: Any) -> dict[str, Any]:
        return {**original(self, **kwargs), "dumped_by": type(self).__name__}

    with pytest.MonkeyPatch.context() as m:
        m.setattr(model, "model_dump", dump)
        result = RUNNER.invoke(app, [str(a) for a in args])
    assert result.exit_code in (0, 10, 11), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc.pop("dumped_by", None) == model.__name__, f"{args[:2]}: --json is not {model.__name__}'s dump"
    again = model.model_validate(doc).model_dump(mode="json", exclude_unset=True)
    assert again == doc
    return doc


def test_use_prepare_and_plan(ws: Workspace, tmp_path: Path) -> None:
    doc = _printed_by(outputs.UsePrepareOutput, "use", "prepare", ws.root / "decl.toml", "--out",
                      tmp_path, "--json")
    assert doc["units"] == 30
    doc = _printed_by(outputs.UsePlanOutput, "use", "plan", ws.contract_path, "--assume",
                      "worse=0.01 better=0.01", "--method", "maurer-pontil", "--sequential-max", "30", "--json")
    assert doc["sequential"]["n_max"] == 30
    assert doc["rows"][0]["method"] == "maurer-pontil"


def test_use_admit_verify_and_inspect_records(ws: Workspace, run: Path, tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    doc = _printed_by(outputs.UseAdmitOutput, "use", "admit", run, "--contract", ws.contract_path,
                      "--receipt", receipt, "--json")
    assert doc["receipt"] == str(receipt)
    assert "sequential" not in doc  # absent, as the decision's own JSON has it, not null
    doc = _printed_by(outputs.UseVerifyOutput, "use", "verify", receipt, "--run", run, "--contract",
                      ws.contract_path, "--trust-embedded-key", "--json")
    assert (doc["signed"], doc["trust"]) == (False, "embedded-key")
    doc = _printed_by(outputs.InspectRecordsOutput, "inspect", "records", run, "--json")
    assert doc["call_log"][0]["seq"] > 0
    doc = _printed_by(outputs.CompareNumericalOutput, "compare", "numerical", run, "--contract", ws.contract_path,
                      "--json")
    assert doc["decision"]["answer"] == "Unknown"


def test_use_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the worker's identity scripted (no worker starts): the fields not asked for are absent, not null."""
    identity = types.SimpleNamespace(engine_version=REFERENCE_IDENTITY["engine_version"],
                                     settings={"device": "cpu", "threads": 1, "patches": {}})
    monkeypatch.setattr("invar.runner.engine.probe_identity",
                        lambda engine, settings, patches, patch_dirs=None: identity)
    doc = _printed_by(outputs.UsePackageOutput, "use", "package", "hf", "--json")
    assert sorted(doc) == ["engine", "engine_version", "settings", "worker_digest"]
    assert doc["settings"] == {"device": "cpu", "threads": 1}


def test_use_run(monkeypatch: pytest.MonkeyPatch, ws: Workspace, tmp_path: Path) -> None:
    """With the run itself scripted (no worker starts): the outcome as UseRunOutput prints it."""
    outcome = RunOutcome(run=tmp_path / "run", contract=ws.contract_path, contract_sha256=ws.sha256, head="a" * 64,
                         calls_total=6, calls_reused=2, calls_issued=4, wall_s=1.23456, already_closed=False,
                         stop={"version": "paired-binary-sequence/1", "look": 1, "units": 16, "answer": "Admitted"})
    # `use run` imports the runner when it runs (its --help does not): the runner's own function is scripted.
    monkeypatch.setattr(use_run_module, "use_run", lambda *args, **kwargs: outcome)
    doc = _printed_by(outputs.UseRunOutput, "use", "run", ws.contract_path, "--run", tmp_path / "run", "--json")
    assert doc == {"run": str(tmp_path / "run"), "contract": str(ws.contract_path), "contract_sha256": ws.sha256,
                   "chain_head": "a" * 64, "calls_total": 6, "calls_reused": 2, "calls_issued": 4, "wall_s": 1.235,
                   "already_closed": False, "sequential_stop": outcome.stop, "signal": None,
                   "admit": admit_command(tmp_path / "run", ws.contract_path, "a" * 64)}


@pytest.mark.parametrize("closed", [False, True])
def test_train(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, closed: bool) -> None:
    """With the training scripted (no worker starts): the outcome as TrainOutput prints it."""
    config = tmp_path / "train.toml"
    ck = Published(cycle=2, path=tmp_path / "run" / "ck", digest="c" * 64, optimizer_steps=4)
    outcome = TrainOutcome(run=tmp_path / "run", config=config, config_digest="d" * 64, head="a" * 64, cycles=3,
                           cycles_reused=1, checkpoint=ck, wall_s=2.0004, already_closed=closed)
    monkeypatch.setattr("invar.runner.train.train", lambda *args, **kwargs: outcome)
    doc = _printed_by(outputs.TrainOutput, "train", config, "--run", tmp_path / "run", "--json")
    assert doc == {"run": str(tmp_path / "run"), "config": str(config), "config_digest": "d" * 64,
                   "chain_head": "a" * 64, "cycles": 3, "cycles_reused": 1, "cycles_run": 0 if closed else 2,
                   "checkpoint": {"cycle": 2, "path": str(ck.path), "digest": "c" * 64}, "wall_s": 2.0,
                   "already_closed": closed, "signal": None, "history": f"invar inspect history {tmp_path / 'run'}"}


def test_train_and_use_run_say_when_a_signal_met_their_last_work(monkeypatch: pytest.MonkeyPatch, ws: Workspace,
                                                                   tmp_path: Path) -> None:
    """A signal that met the last cycle (or the plan's last calls) under way, which then finished: exit 0, the usual
    output, one line on stderr, `signal` in --json (the runners' side: tests/runner/test_train_fake_workers.py and
    test_use_run_interrupt.py)."""
    config = tmp_path / "train.toml"
    trained = TrainOutcome(run=tmp_path / "run", config=config, config_digest="d" * 64, head="a" * 64, cycles=3,
                           cycles_reused=1, checkpoint=None, wall_s=2.0, already_closed=False, signal="Ctrl-C")
    ran = RunOutcome(run=tmp_path / "use", contract=ws.contract_path, contract_sha256=ws.sha256, head="b" * 64,
                     calls_total=6, calls_reused=0, calls_issued=6, wall_s=1.0, already_closed=False,
                     signal="SIGTERM")
    monkeypatch.setattr("invar.runner.train.train", lambda *args, **kwargs: trained)
    monkeypatch.setattr(use_run_module, "use_run", lambda *args, **kwargs: ran)
    cases = [(["train", config, "--run", tmp_path / "run"], "Ctrl-C came while the last cycle was under way; it "
              "finished, and the run is complete"),
             (["use", "run", ws.contract_path, "--run", tmp_path / "use"], "SIGTERM came while the run's last calls "
              "were under way; they were answered, and the run is complete")]
    for args, line in cases:
        text = RUNNER.invoke(app, [str(a) for a in args])
        assert text.exit_code == 0, text.output
        assert text.stderr.splitlines() == [f"invar: {line}"]
        assert "chain head" in text.stdout
        printed = RUNNER.invoke(app, [*(str(a) for a in args), "--json"])
        assert printed.exit_code == 0, printed.output
        assert printed.stderr.splitlines() == [f"invar: {line}"]
        assert json.loads(printed.stdout)["signal"] == line.split(" ")[0]


def test_inspect_history(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With the history scripted (no training run): each cycle's numbers as HistoryCycle prints them."""
    config = read_config(write_config(tmp_path, "models", "hf", cycles=1))
    cycle = CycleHistory(
        cycle=0, prompts=4, samples=16, reward_mean=0.25, accuracy=0.25, accuracy_interval=(0.07, 0.52),
        advantage_mean=0.0, advantage_std=0.9, advantage_min=-1.5, advantage_max=1.5, zero_variance_groups=1,
        groups=4, loss_core=0.1, loss_learner=0.1, loss_abs_diff=0.0, policy_core=0.1, kl_core=0.0, grad_norm=2.5,
        gap=Gap(tokens=40, equal=30, p50=0.0, p99=1e-6, max=2e-6, k3_mean=0.0, k3_max=1e-12),
        importance=Importance(min=0.9, mean=1.0, max=1.1, exactly_one=30, handled=0, ess=0.99), staleness=0,
        policy=None, checkpoint="c" * 64, wall_s={"generate": 1.5, "learner": 2.5, "publish": 0.5})
    history = History(tmp_path / "run", config, True, "a" * 64, [cycle])
    # the command imports the reader when it runs (its module costs `inspect`'s start): patched where it lives
    monkeypatch.setattr(loop_history, "read_history", lambda *args, **kwargs: history)
    doc = _printed_by(outputs.InspectHistoryOutput, "inspect", "history", tmp_path / "run", "--json")
    assert doc["config"] == json.loads(json.dumps(config.canonical()))
    (row,) = doc["cycles"]
    assert row == {**json.loads(json.dumps(dataclasses.asdict(cycle))), "accuracy_interval": [0.07, 0.52]}


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """infer, evaluate and score start the in-process fake worker instead of an engine."""
    real = engine.engine_session

    @contextlib.contextmanager
    def session(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **{**kwargs, "placement": FakeTransport()}) as started:
            yield started

    for module in (engine, evaluate, score):  # infer imports the runner's when it runs
        monkeypatch.setattr(module, "engine_session", session)


@pytest.mark.usefixtures("fake_engine")
def test_engine_commands(tmp_path: Path) -> None:
    doc = _printed_by(outputs.InferOutput, "infer", "37+58=", "12*7=", "--engine", "hf", "--run", tmp_path / "a",
                      "--json")
    assert "messages" not in doc["outputs"][0]  # only with --chat
    _printed_by(outputs.InferOutput, "infer", "37+58=", "12*7=", "--engine", "hf", "--dtype", "bfloat16", "--run",
                tmp_path / "b", "--json")
    doc = _printed_by(outputs.EvaluateAnyOutput, "evaluate", "--count", "4", "--engine", "hf", "--run",
                      tmp_path / "eval", "--json")
    assert doc["problems"] == 4
    doc = _printed_by(outputs.ScoreOutput, "score", "--from-run", tmp_path / "a", "--engine", "hf", "--run",
                      tmp_path / "score", "--json")
    assert doc["vocab_size"] is None  # nothing captured
    assert "patches" not in doc
    doc = _printed_by(outputs.CompareNumericalOutput, "compare", "numerical", tmp_path / "a", tmp_path / "b",
                      "--json")
    assert doc["decision"] is None


def test_version_and_keys_new(tmp_path: Path) -> None:
    assert _printed_by(outputs.VersionOutput, "--version", "--json")["output_schemas"] == outputs.OUTPUT_SCHEMA_VERSION
    doc = _printed_by(outputs.KeysNewOutput, "keys", "new", "--out", tmp_path, "--json")
    assert Path(doc["public_key"]).is_file()
