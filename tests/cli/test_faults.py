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
