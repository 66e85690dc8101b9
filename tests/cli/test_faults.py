"""Hostile and odd inputs that once escaped as a traceback, a hang or an unbounded read: each is one line on stderr
and exit 2, at once, before any worker starts.

The command lines run through one process (tests/support/cli_batch.py: each as `python -m invar.cli` runs it, with
its own exit status, stdout and stderr, bounded by SIGALRM, under a 4 GiB address-space cap), so the file pays the
CLI's start-up once instead of once per case; each test reads its case's result and folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.cli_batch import Case, Ran, invar_batch

from invar.errors import InvarError
from invar.runner.use_run import MAX_WORKERS, use_run, workers_per_package

BOUND_S = 60
"""What "at once" allows on a loaded machine; a hang or a read without end runs past it."""

MEMORY = 4 << 30
"""A read without end fails in seconds instead of taking the machine's memory (the bug this file guards)."""

MODEL_COMMANDS = [["infer", "1+1="], ["evaluate", "--count", "2"], ["score", "--tokens", "t.jsonl"]]
TOKENS = [2**63, 2**31, -1]
KEY_NAMES = ["../escape", "", ".hidden", "a/b", "/abs", "x\ny", "..", "a" * 65]
WORKERS = ["65", str(10**9), "0"]


def _one_line(out: Ran, message: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr, out.stderr
    assert out.seconds < BOUND_S


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


Results = dict[str, tuple[Path, Ran]]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, root: Path) -> Results:
    """Every command line of this file, each in a folder of its own (made here, as each test once made its own),
    run once in the order written; by case, its folder and what its command did."""
    base = tmp_path_factory.mktemp("faults")
    cases: dict[str, tuple[Path, Case]] = {}

    def add(key: str, args: list[str], cwd: bool = False, where: Path | None = None) -> Path:
        folder = where or base / f"case{len(cases)}"
        folder.mkdir(exist_ok=True)
        cases[key] = (folder, Case(args, folder if cwd else None))
        return folder

    for case in range(4):
        folder = base / f"device{case}"
        folder.mkdir()
        add(f"device{case}", _files_read(folder, Path("/dev/zero"))[case][0], where=folder)
        folder = base / f"fifo{case}"
        folder.mkdir()
        os.mkfifo(folder / "fifo")
        add(f"fifo{case}", _files_read(folder, folder / "fifo")[case][0], where=folder)
    folder = base / "big"
    folder.mkdir()
    big = folder / "big.json"
    with open(big, "wb") as f:
        f.truncate((1 << 20) + 1)  # sparse: costs no disk
    add("big", ["use", "verify", str(big), "--run", str(folder / "run"), "--contract", str(big)], where=folder)
    for i, command in enumerate(MODEL_COMMANDS):
        for kind in ("empty", "fifo"):
            folder = base / f"model-{kind}{i}"
            (folder / "model").mkdir(parents=True)
            if kind == "fifo":
                os.mkfifo(folder / "model" / "config.json")
            (folder / "t.jsonl").write_text('{"item_id": "a", "prompt": "1+1=", "tokens": [5]}\n')
            add(f"model-{kind}{i}", [*command, "--model", str(folder / "model"), "--run", str(folder / "run")],
                cwd=True, where=folder)
    for token in TOKENS:
        folder = base / f"token{token}"
        folder.mkdir()
        (folder / "t.jsonl").write_text(json.dumps({"item_id": "a", "prompt": "1+1=", "tokens": [5, token]}) + "\n")
        add(f"token{token}", ["score", "--tokens", str(folder / "t.jsonl"), "--run", str(folder / "run")],
            where=folder)
    folder = add("prepare", ["use", "prepare", str(root / "contracts" / "walkthrough.toml"), "--out",
                             str(base / "sequential")])
    add("sequential", ["use", "plan", str(base / "sequential" / "walkthrough.contract.json"), "--assume",
                       "worse=0.01 better=0.01", "--sequential-max", str(10**30)])
    odd = base / "two\nlines\r.json"
    add("newline", ["use", "verify", str(odd), "--run", str(base / "newline-run"), "--contract", str(odd)])
    for i, name in enumerate(KEY_NAMES):
        folder = base / f"key{i}"
        folder.mkdir()
        add(f"key{i}", ["keys", "new", "--out", str(folder / "keys"), "--name", name], cwd=True, where=folder)
    folder = base / "plain-key"
    folder.mkdir()
    add("plain-key", ["keys", "new", "--out", str(folder / "keys"), "--name", "Owner-2.test_a"], where=folder)
    for workers in WORKERS:
        folder = base / f"workers{workers}"
        folder.mkdir()
        add(f"workers{workers}", ["use", "run", str(folder / "c.contract.json"), "--run", str(folder / "run"),
                                  "--workers", workers], where=folder)
    folder = base / "vocabulary"
    folder.mkdir()
    # An int32 id the shipped model's 18-token vocabulary lacks.
    (folder / "t.jsonl").write_text(json.dumps({"item_id": "a", "prompt": "1+1=", "tokens": [5, 18]}) + "\n")
    add("vocabulary", ["score", "--tokens", str(folder / "t.jsonl"), "--run", str(folder / "run")], where=folder)

    results = invar_batch([case for _, case in cases.values()], bound_s=BOUND_S, memory_bytes=MEMORY)
    return {key: (folder, result) for (key, (folder, _)), result in zip(cases.items(), results, strict=True)}


@pytest.mark.parametrize("case", range(4))
def test_a_device_for_a_file_is_refused_not_read_without_end(ran: Results, case: int) -> None:
    folder, out = ran[f"device{case}"]
    named = _files_read(folder, Path("/dev/zero"))[case][1]
    _one_line(out, f"{named} is a character device, not a regular file")
    assert not (folder / "run").exists()


@pytest.mark.parametrize("case", range(4))
def test_a_fifo_for_a_file_is_refused_not_waited_on(ran: Results, case: int) -> None:
    folder, out = ran[f"fifo{case}"]
    named = _files_read(folder, folder / "fifo")[case][1]
    _one_line(out, f"{named} is a FIFO, not a regular file")


def test_a_file_past_its_bound_is_refused_unread(ran: Results) -> None:
    folder, out = ran["big"]
    _one_line(out, f"receipt {folder / 'big.json'} holds 1,048,577 bytes, over the 1,048,576 a receipt may hold")


@pytest.mark.parametrize("command", range(len(MODEL_COMMANDS)))
@pytest.mark.parametrize("folder", ["empty", "fifo"])
def test_a_model_folder_that_cannot_be_digested_is_one_line(ran: Results, command: int, folder: str) -> None:
    where, out = ran[f"model-{folder}{command}"]
    _one_line(out, "the folder is empty or missing; pass the folder" if folder == "empty" else
              "config.json: not a regular file (a pipe, device or socket)")
    assert not (where / "run").exists()


@pytest.mark.parametrize("token", TOKENS)
def test_a_token_id_outside_int32_is_one_line(ran: Results, token: int) -> None:
    _one_line(ran[f"token{token}"][1], f"line 1: token id {token} is outside [0, 2^31 − 1]")


def test_a_sequential_max_past_its_bound_is_one_line(ran: Results) -> None:
    prepared = ran["prepare"][1]
    assert prepared.returncode == 0, prepared.stderr
    _one_line(ran["sequential"][1], f"--sequential-max {10**30}: at most 16,777,216 units")


def test_a_path_with_a_newline_stays_one_line(ran: Results) -> None:
    _one_line(ran["newline"][1], "two\\nlines\\r.json does not exist")


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


@pytest.mark.parametrize("name", range(len(KEY_NAMES)), ids=KEY_NAMES)
def test_a_key_name_that_is_not_a_plain_file_name_is_refused(ran: Results, name: int) -> None:
    folder, out = ran[f"key{name}"]
    _one_line(out, "a key's name is a plain file name")
    assert sorted(p.name for p in folder.iterdir()) == []  # nothing written, inside --out or beside it


def test_a_plain_key_name_is_written_inside_out(ran: Results) -> None:
    folder, made = ran["plain-key"]
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (folder / "keys").iterdir()) == ["Owner-2.test_a.key", "Owner-2.test_a.pub"]


@pytest.mark.parametrize("workers", WORKERS)
def test_workers_past_the_bound_are_one_line_and_start_nothing(ran: Results, workers: str) -> None:
    folder, out = ran[f"workers{workers}"]
    _one_line(out, f"--workers {workers}: must be ≥ 1 and at most 64")
    assert not (folder / "run").exists()


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


def test_a_token_id_outside_the_vocabulary_is_one_line_before_a_worker_starts(ran: Results) -> None:
    # An int32 id the shipped model's 18-token vocabulary lacks: refused before the worker loads the model and
    # before the run is made (issue 51: only int32 was checked first, then a worker started).
    folder, out = ran["vocabulary"]
    _one_line(out, "item a: response token ids must be in [0, 18), the model's vocabulary")
    assert not (folder / "run").exists()
