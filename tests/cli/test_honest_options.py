"""Options are checked before any worker starts, and what the CLI prints is honest: no silently dropped setting, no
ignored flag, no Python repr or `None` where a user reads, no bytes in JSON (issue 27)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli_batch import Case, Ran, invar_batch
from typer.testing import CliRunner

from invar.cli.app import app
from invar.errors import InvarError
from invar.runner.engine import LAUNCH_SETTINGS, launch_args, parse_launch_settings


def _invar(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def _one_line_error(out: subprocess.CompletedProcess[str] | Ran) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("invar: error: "), out.stderr
    assert "Traceback" not in out.stderr
    assert "usage:" not in out.stderr
    return lines[0]


BAD_SETTINGS = [
    (["hf", "--setting", "attn_implementaton=eager"], ["'attn_implementaton'", "device, threads, attn_implementation"]),
    (["hf", "--setting", "threads=abc"], ["threads takes an integer, not 'abc'"]),
    (["hf", "--setting", "attn_implementation=flash"], ["attn_implementation is one of sdpa, eager"]),
    (["hf", "--setting", "threads"], ["write NAME=VALUE", "device, threads, attn_implementation"]),
    (["vllm", "--setting", "enforce_eager=maybe"], ["enforce_eager takes true or false"]),
    (["vllm", "--setting", "gpu_memory_utilization=nan"], ["gpu_memory_utilization takes a number"]),
    (["mlx", "--setting", "threads=1"], ["mlx has no launch setting 'threads'", "map_rope_parameters"]),
]


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """The command lines below that start no worker, run through one process (tests/support/cli_batch.py: each as
    `python -m invar.cli` runs it, its own exit status, stdout and stderr), so the file pays the CLI's start-up
    once; by case, what its command did."""
    base = tmp_path_factory.mktemp("honest")
    from invar.records import RunStore

    store = RunStore.create(base / "run", meta={"purpose": "not a command's run"})
    store.close_run()
    store.close()
    cases: dict[str, list[str | Path]] = {f"setting{i}": ["use", "package", *args]
                                          for i, (args, _) in enumerate(BAD_SETTINGS)}
    cases |= {"json-first": ["--json", "use", "plan", "missing.contract.json"], "help": ["--help"],
              "version": ["--version", "--json"],
              "capture-steps": ["score", "--tokens", base / "items.jsonl", "--capture-steps", ""],
              "score-help": ["score", "--help"], "no-command-score": ["score", "--from-run", base / "run"],
              "no-command-compare": ["compare", "numerical", base / "run", base / "run"]}
    ran = invar_batch([Case(args) for args in cases.values()], bound_s=120)
    return dict(zip(cases, ran, strict=True))


# -- 1. --setting is checked against the engine's declared launch settings -------------------------------------


@pytest.mark.parametrize("case", range(len(BAD_SETTINGS)), ids=[" ".join(a) for a, _ in BAD_SETTINGS])
def test_use_package_refuses_a_bad_setting_in_one_line(lines: dict[str, Ran], case: int) -> None:
    line = _one_line_error(lines[f"setting{case}"])
    for name in BAD_SETTINGS[case][1]:
        assert name in line, line


def test_a_bad_setting_is_refused_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_worker(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a worker was started for a setting that is refused")

    monkeypatch.setattr("invar.runner.engine.probe_identity", no_worker)
    for bad in ("attn_implementaton=eager", "threads=abc", "threads=1.5"):
        result = CliRunner().invoke(app, ["use", "package", "hf", "--setting", bad])
        assert isinstance(result.exception, InvarError), (bad, result.exception)


def test_settings_are_typed_and_every_declared_one_reaches_the_worker_command_line() -> None:
    settings = parse_launch_settings("hf", ["threads=2", "attn_implementation=eager", "device=cpu"])
    assert settings == {"threads": 2, "attn_implementation": "eager", "device": "cpu"}
    assert launch_args("hf", settings, {}) == ["--device", "cpu", "--threads", "2", "--attn-implementation", "eager"]
    # A boolean given as text used to be dropped (`"false" is False` never held); now it is the flag.
    vllm = parse_launch_settings("vllm", ["enforce_eager=false", "max_num_seqs=4"])
    assert vllm == {"enforce_eager": False, "max_num_seqs": 4}
    assert launch_args("vllm", vllm, {}) == ["--max-num-seqs", "4", "--no-enforce-eager"]
    with pytest.raises(InvarError, match="given twice"):
        parse_launch_settings("hf", ["threads=1", "threads=2"])
    assert set(LAUNCH_SETTINGS) >= {"hf", "vllm", "mlx"}


def test_every_help_example_of_use_package_names_real_settings() -> None:
    from invar.cli.app import EXAMPLES

    for line in EXAMPLES["use package"]:
        words = line.split()
        engine = words[3]
        settings = [words[i + 1] for i, w in enumerate(words) if w == "--setting"]
        parse_launch_settings(engine, settings)  # raises on a name the engine does not take


@pytest.mark.engine
def test_the_help_example_setting_is_what_the_worker_runs() -> None:
    out = _invar("use", "package", "hf", "--setting", "attn_implementation=eager", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["settings"]["attn_implementation"] == "eager"  # was "sdpa": the name was dropped


# -- 2. the top-level --json is read only with --version, and refused before a command ---------------------------


def test_top_level_json_is_not_silently_ignored(lines: dict[str, Ran]) -> None:
    line = _one_line_error(lines["json-first"])
    assert "put it after the command" in line, line
    options = [line.split()[0] for line in lines["help"].stdout.splitlines() if line.startswith("  --")]
    assert "--version" in options
    assert "--json" not in options  # not offered as a global flag
    out = lines["version"]
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["invar"]


# -- 3. bytes never reach JSON as reprs, and JSON has no NaN or Infinity ------------------------------------------


def test_inspect_records_json_gives_kept_files_as_digests_and_sizes(tmp_path: Path) -> None:
    import hashlib

    import numpy as np

    from invar.records import RunStore

    kept = b"\x00\x01 a kept file " * 20_000  # 300 kB, as a run keeps its population and tokenizer bytes
    store = RunStore.create(tmp_path / "run", meta={"inputs": {"population.jsonl": kept},
                                                    "array": np.arange(4, dtype=np.int32), "ratio": float("nan")})
    store.close_run()
    store.close()
    out = _invar("inspect", "records", tmp_path / "run", "--json")
    assert out.returncode == 0, out.stderr
    assert "b'" not in out.stdout
    assert "NaN" not in out.stdout
    assert len(out.stdout) < 10_000  # was the whole file, as a repr
    meta = json.loads(out.stdout)["meta"]
    assert meta["run"]["inputs"]["population.jsonl"] == {"sha256": hashlib.sha256(kept).hexdigest(),
                                                         "bytes": len(kept)}
    assert meta["run"]["array"]["shape"] == [4]
    assert meta["run"]["ratio"] is None


# -- 4, 5. score's options and help; no "None" in a message -------------------------------------------------------


def test_score_refuses_an_empty_capture_steps(lines: dict[str, Ran]) -> None:
    line = _one_line_error(lines["capture-steps"])
    assert "--capture-steps '': name at least one step" in line, line  # was "0 captures of None tokens", exit 0


def test_score_help_shows_the_token_list(lines: dict[str, Ran]) -> None:
    out = lines["score-help"]
    assert '"tokens": [ids]' in " ".join(out.stdout.replace("│", " ").split()), out.stdout  # was `"tokens": ,`


def test_a_run_no_command_made_is_named_without_none(lines: dict[str, Ran]) -> None:
    # The run (made by `lines`) is a RunStore no invar command made.
    for key in ("no-command-score", "no-command-compare"):
        line = _one_line_error(lines[key])
        assert "None" not in line, line
        assert "a run whose records name no invar command" in line, line


def test_a_contract_without_a_schema_is_named_without_none() -> None:
    from invar.contract.model import parse_contract
    from invar.errors import ContractError

    with pytest.raises(ContractError) as err:
        parse_contract(b'{"name": "x"}', "c.contract.json")
    assert "None" not in str(err.value)
    assert "it states no schema" in str(err.value)


def test_the_compare_docs_capture_steps_are_within_every_shipped_response() -> None:
    from invar.compare.steps import parse_steps, resolve_steps

    doc = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text(encoding="utf-8")
    given = [line.split("--capture-steps ")[1].split()[0] for line in doc.splitlines()
             if line.startswith("invar score") and "--capture-steps " in line]
    assert given
    for text in given:  # the shipped model's shortest response: one digit and EOS
        resolve_steps(parse_steps(text), 2, strict=True)
