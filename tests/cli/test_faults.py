"""Hostile and odd inputs that once escaped as a traceback, a hang or an unbounded read: each is one line on stderr
and exit 2, at once, before any worker starts."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from invar.errors import InvarError
from invar.runner.use_run import MAX_WORKERS, use_run, workers_per_package

BOUND_S = 60
"""What "at once" allows on a loaded machine; a hang or a read without end runs past it."""


def _invar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    def small() -> None:
        # A read without end fails in seconds instead of taking the machine's memory (the bug this file guards).
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True,
                          timeout=BOUND_S, cwd=cwd, preexec_fn=small)


def _one_line(out: subprocess.CompletedProcess[str], message: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr, out.stderr


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _files_read(tmp_path: Path, odd: Path) -> list[tuple[list[str], str]]:
    """Every command line that reads a file whole, with `odd` given for that file, and the file's name in errors."""
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps({"receipt": {"schema": "invar.receipt/1"}, "signature": None}))
    contract = tmp_path / "c.contract.json"
    contract.write_text("{}")
    run = str(tmp_path / "run")
    return [
        (["use", "verify", str(odd), "--run", run, "--contract", str(contract)], f"receipt {odd}"),
        (["use", "verify", str(receipt), "--run", run, "--contract", str(contract), "--public-key", str(odd)],
         f"public key {odd}"),
        (["use", "admit", run, "--contract", str(contract), "--receipt", str(tmp_path / "r.json"), "--key", str(odd)],
         f"private key {odd}"),
        (["score", "--tokens", str(odd), "--run", run], f"--tokens file {odd}"),
    ]


@pytest.mark.parametrize("case", range(4))
def test_a_device_for_a_file_is_refused_not_read_without_end(tmp_path: Path, case: int) -> None:
    args, named = _files_read(tmp_path, Path("/dev/zero"))[case]
    _one_line(_invar(*args), f"{named} is a character device, not a regular file")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", range(4))
def test_a_fifo_for_a_file_is_refused_not_waited_on(tmp_path: Path, fifo: Path, case: int) -> None:
    args, named = _files_read(tmp_path, fifo)[case]
    _one_line(_invar(*args), f"{named} is a FIFO, not a regular file")


def test_a_file_past_its_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate((1 << 20) + 1)  # sparse: costs no disk
    _one_line(_invar("use", "verify", str(big), "--run", str(tmp_path / "run"), "--contract", str(big)),
              f"receipt {big} holds 1,048,577 bytes, over the 1,048,576 a receipt may hold")


@pytest.mark.parametrize("command", [["infer", "1+1="], ["evaluate", "--count", "2"], ["score", "--tokens", "t.jsonl"]])
@pytest.mark.parametrize("folder", ["empty", "fifo"])
def test_a_model_folder_that_cannot_be_digested_is_one_line(tmp_path: Path, command: list[str], folder: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    if folder == "fifo":
        os.mkfifo(model / "config.json")
    (tmp_path / "t.jsonl").write_text('{"item_id": "a", "prompt": "1+1=", "tokens": [5]}\n')
    out = _invar(*command, "--model", str(model), "--run", str(tmp_path / "run"), cwd=tmp_path)
    _one_line(out, "the folder is empty or missing; pass the folder" if folder == "empty" else
              "config.json: not a regular file (a pipe, device or socket)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("token", [2**63, 2**31, -1])
def test_a_token_id_outside_int32_is_one_line(tmp_path: Path, token: int) -> None:
    tokens = tmp_path / "t.jsonl"
    tokens.write_text(json.dumps({"item_id": "a", "prompt": "1+1=", "tokens": [5, token]}) + "\n")
    _one_line(_invar("score", "--tokens", str(tokens), "--run", str(tmp_path / "run")),
              f"line 1: token id {token} is outside [0, 2^31 − 1]")


def test_a_sequential_max_past_its_bound_is_one_line(tmp_path: Path, root: Path) -> None:
    prepared = _invar("use", "prepare", str(root / "contracts" / "walkthrough.toml"), "--out", str(tmp_path))
    assert prepared.returncode == 0, prepared.stderr
    out = _invar("use", "plan", str(tmp_path / "walkthrough.contract.json"), "--assume", "worse=0.01 better=0.01",
                 "--sequential-max", str(10**30))
    _one_line(out, f"--sequential-max {10**30}: at most 16,777,216 units")


def test_a_path_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    odd = tmp_path / "two\nlines\r.json"
    out = _invar("use", "verify", str(odd), "--run", str(tmp_path / "run"), "--contract", str(odd))
    _one_line(out, "two\\nlines\\r.json does not exist")


def test_a_workers_error_text_with_newlines_stays_one_line(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from invar.cli import app as cli
    from invar.errors import WorkerError

    def fails(**_: object) -> None:  # main() calls the app as app(standalone_mode=False)
        raise WorkerError("generate", "MethodError", "CUDA out of memory\nTraceback (most recent call last):\n  x")

    monkeypatch.setattr(cli, "app", fails)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == "invar: error: generate: MethodError: CUDA out of memory\\nTraceback (most recent call last):\\n  x\n"


@pytest.mark.parametrize("name", ["../escape", "", ".hidden", "a/b", "/abs", "x\ny", "..", "a" * 65])
def test_a_key_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path, name: str) -> None:
    out = tmp_path / "keys"
    _one_line(_invar("keys", "new", "--out", str(out), "--name", name, cwd=tmp_path),
              "a key's name is a plain file name")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, inside --out or beside it


def test_a_plain_key_name_is_written_inside_out(tmp_path: Path) -> None:
    made = _invar("keys", "new", "--out", str(tmp_path / "keys"), "--name", "Owner-2.test_a")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["Owner-2.test_a.key", "Owner-2.test_a.pub"]


@pytest.mark.parametrize("workers", ["65", str(10**9), "0"])
def test_workers_past_the_bound_are_one_line_and_start_nothing(tmp_path: Path, workers: str) -> None:
    run = tmp_path / "run"
    out = _invar("use", "run", str(tmp_path / "c.contract.json"), "--run", str(run), "--workers", workers)
    _one_line(out, f"--workers {workers}: must be ≥ 1 and at most 64")
    assert not run.exists()


def test_no_package_starts_more_workers_than_it_has_calls_left(tmp_path: Path) -> None:
    calls: dict[str, list[object]] = {"reference": [object(), object()], "candidate": [object()]}
    measure: dict[str, list[object]] = {"reference": [], "candidate": [object()]}
    assert workers_per_package(calls, measure, 6) == {"reference": 2, "candidate": 2}  # type: ignore[arg-type]
    assert workers_per_package(calls, measure, 1) == {"reference": 1, "candidate": 1}  # type: ignore[arg-type]
    assert workers_per_package({"reference": [], "candidate": []}, {"reference": [], "candidate": []},  # type: ignore[arg-type]
                               6) == {"reference": 0, "candidate": 0}
    with pytest.raises(InvarError, match=f"at most {MAX_WORKERS}"):
        use_run(tmp_path / "never-read.contract.json", tmp_path / "run", workers=MAX_WORKERS + 1)
    assert not (tmp_path / "run").exists()


def test_a_token_id_outside_the_vocabulary_is_one_line_before_a_worker_starts(tmp_path: Path) -> None:
    # An int32 id the shipped model's 18-token vocabulary lacks: refused before the worker loads the model and
    # before the run is made (issue 51: only int32 was checked first, then a worker started).
    tokens = tmp_path / "t.jsonl"
    tokens.write_text(json.dumps({"item_id": "a", "prompt": "1+1=", "tokens": [5, 18]}) + "\n")
    _one_line(_invar("score", "--tokens", str(tokens), "--run", str(tmp_path / "run")),
              "item a: response token ids must be in [0, 18), the model's vocabulary")
    assert not (tmp_path / "run").exists()
