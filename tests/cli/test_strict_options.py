"""Repeated and mistyped KEY=VALUE options are refused, never resolved silently (issue 26, "strict by default"): a
key given twice (`--assume`, `--setting`, `--scorer-setting`) is one line naming the key, where the last one used
to win; an engine launch setting is checked by name, type and value against the engine's worker before any worker
starts (`device=gpu` was accepted for hf and failed inside torch)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from invar.cli import use
from invar.cli.app import app
from invar.errors import InvarError

RUNNER = CliRunner()


def _refused(result: Result) -> str:
    """The one line a refused command prints (`invar.cli.app.main` prints an `InvarError` as it is)."""
    assert isinstance(result.exception, InvarError), (result.exception, result.output)
    text = str(result.exception)
    assert "\n" not in text
    return text


def _no_worker(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("a worker was started for options that are refused")


# -- use plan --assume ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("assume", [["worse=0.01 better=0.01 worse=0.02"], ["worse=0.01", "worse=0.02"],
                                    ["worse=0.01,worse=0.02", "better=0.01"]])
def test_an_assumption_given_twice_is_refused_naming_it(assume: list[str]) -> None:
    args = [a for value in assume for a in ("--assume", value)]
    # The contract is not read: the assumptions are checked first, so a missing file does not hide the refusal.
    with pytest.raises(InvarError) as info:
        use.parse_assumptions(assume)
    assert str(info.value) == ("--assume worse is given twice (worse=0.01, then worse=0.02); state each assumption "
                               "once")
    result = RUNNER.invoke(app, ["use", "plan", "missing.contract.json", *args])
    assert _refused(result) == str(info.value)


@pytest.mark.parametrize("number", ["nan", "inf", "1_0", "0x1", "1e999"])
def test_an_assumption_that_is_no_decimal_number_is_refused(number: str) -> None:
    result = RUNNER.invoke(app, ["use", "plan", "missing.contract.json", "--assume", f"worse={number} better=0.01"])
    assert _refused(result) == f"--assume worse={number}: '{number}' is not a number; write a decimal such as 0.01"


def test_distinct_assumptions_still_read() -> None:
    assert use.parse_assumptions(["worse=0.01", "better=0.02"]) == {"p_worse": 0.01, "p_better": 0.02}
    assert use.parse_assumptions(["variance=2e-2 mean=0"]) == {"variance": 0.02, "mean": 0.0}


# -- use package --setting --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("engine", "setting", "message"), [
    ("hf", "device=gpu", "--setting 'device=gpu': device is one of cpu, cuda"),
    ("vllm", "device=gpu", "--setting 'device=gpu': device is one of auto, cpu, cuda"),
    ("hf", "nosuch=1", "--setting 'nosuch=1': hf has no launch setting 'nosuch'; the hf launch settings are: "
                       "device, threads, attn_implementation"),
    ("hf", "threads=1_0", "--setting 'threads=1_0': threads takes an integer, not '1_0'"),
    ("hf", "threads=true", "--setting 'threads=true': threads takes an integer, not 'true'"),
    ("vllm", "gpu_memory_utilization=0x1", "--setting 'gpu_memory_utilization=0x1': gpu_memory_utilization takes a "
                                           "number, not '0x1'"),
    ("vllm", "max_lora_rank=4", "--setting 'max_lora_rank=4': max_lora_rank is one of 1, 8, 16, 32, 64, 128, 256"),
])
def test_a_launch_setting_is_checked_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch, engine: str,
                                                              setting: str, message: str) -> None:
    monkeypatch.setattr("invar.runner.engine.probe_identity", _no_worker)
    assert _refused(RUNNER.invoke(app, ["use", "package", engine, "--setting", setting])) == message


def test_a_launch_setting_given_twice_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("invar.runner.engine.probe_identity", _no_worker)
    result = RUNNER.invoke(app, ["use", "package", "hf", "--setting", "threads=1", "--setting", "threads=2"])
    assert _refused(result) == "--setting threads is given twice; give each setting once"


# -- evaluate --scorer-setting ----------------------------------------------------------------------------------------

def test_a_scorer_setting_given_twice_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("invar.runner.evaluate.evaluate_policy", _no_worker)
    pop = tmp_path / "pop.jsonl"
    pop.write_text(json.dumps({"id": "u1", "prompt": "2+2=", "answer": "4"}) + "\n", encoding="utf-8")
    sha = hashlib.sha256(pop.read_bytes()).hexdigest()
    result = RUNNER.invoke(app, ["evaluate", "--population", str(pop), "--population-sha256", sha, "--scorer",
                                 "exact-match", "--scorer-setting", "case_fold=true", "--scorer-setting",
                                 "case_fold=false", "--run", str(tmp_path / "run")])
    assert _refused(result) == ("--scorer-setting case_fold is given twice (case_fold=true, then case_fold=false); "
                                "give each setting once")
    assert not (tmp_path / "run").exists()
