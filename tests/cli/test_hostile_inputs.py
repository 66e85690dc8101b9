"""Inputs a hostile or careless user gives the CLI: each is one line and exit 2, refused before any worker starts,
and nothing in the working directory can stand in for a worker."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from invar import canonical
from invar.engines import start_worker, worker_digest

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to
ECHO = REPO_ROOT / "src" / "invar" / "workers" / "echo.py"


def _invar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


@pytest.mark.parametrize(("args", "message"), [
    (["--temperature", "nan"], "--temperature nan: must be a finite number in [0, 10]"),
    (["--temperature", "inf"], "--temperature inf: must be a finite number"),
    (["--temperature", "-1"], "--temperature -1.0: must be a finite number"),
    (["--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
    (["--top-p", "nan"], "--top-p nan: must be in (0, 1]"),
    (["--seed", "18446744073709551616"], "--seed 18446744073709551616: request seeds must be in [0, 2^63 − 1]"),
    (["--seed", "-5"], "--seed -5: request seeds must be in [0, 2^63 − 1]"),
    (["--max-tokens", "0"], "--max-tokens 0: must be at least 1"),
    (["--max-tokens", "500"], "exceed the model's context of 128 tokens"),
    (["--call-timeout", "0"], "--call-timeout 0.0: must be a positive number of seconds"),
])
def test_sampling_options_are_refused_before_any_worker(tmp_path: Path, args: list[str], message: str) -> None:
    started = time.monotonic()
    out = _invar("infer", "1+1=", *args, "--run", str(tmp_path / "run"))
    assert out.returncode == 2, out.stdout
    assert message in out.stderr
    assert out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()  # no run, so no worker and no record
    assert time.monotonic() - started < 30  # no model was loaded first


def test_evaluate_refuses_nan_temperature_too(tmp_path: Path) -> None:
    out = _invar("evaluate", "--count", "5", "--temperature", "nan", "--run", str(tmp_path / "run"))
    assert out.returncode == 2
    assert "--temperature nan" in out.stderr
    assert not (tmp_path / "run").exists()


def test_run_directories_that_cannot_be_runs(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for run, message in ((tmp_path / "file", "is a file, not a folder"),
                         (tmp_path / "file" / "run", "a path component is a file")):
        out = _invar("infer", "1+1=", "--run", str(run))
        assert out.returncode == 2
        assert message in out.stderr
        assert out.stderr.count("\n") == 1
        assert "Traceback" not in out.stderr


def test_a_workers_folder_in_the_working_directory_cannot_impersonate_a_worker(tmp_path: Path) -> None:
    marker = tmp_path / "impersonated"
    # An `invar/workers/` package (or a bare `workers/`) where the command runs must not stand in for the worker.
    for fake in (tmp_path / "invar" / "workers", tmp_path / "workers"):
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("")
        (fake / "echo.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (tmp_path / "invar" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    script = ("from invar.engines import start_worker\n"
              "w = start_worker('echo')\n"
              "print(w.identity.worker['sha256'])\n"
              "w.close()\n")
    # -P: the calling process imports the real core, as the `invar` script does; the question is the worker's.
    out = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    assert out.stdout.strip() == canonical.file_sha256(ECHO)


def test_the_identity_names_the_worker_code() -> None:
    with start_worker("echo") as w:
        assert w.identity.worker == {"module": "invar.workers.echo",
                                     "sha256": canonical.file_sha256(ECHO), "digest": worker_digest("echo")}
