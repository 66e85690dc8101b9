"""Inputs a hostile or careless user gives the CLI: each is one line and exit 2, refused before any worker starts,
and nothing in the working directory can stand in for a worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_batch import Case, Ran, invar_batch

from invar import canonical
from invar.engines import start_worker, worker_digest

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to
ECHO = REPO_ROOT / "src" / "invar" / "workers" / "echo.py"


SAMPLING = [
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
]

Refusals = dict[str, tuple[Path, Ran]]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> Refusals:
    """The refused command lines below, each with a folder of its own, run through one process
    (tests/support/cli_batch.py: each as `python -m invar.cli` runs it, its own exit status and stderr, timed), so
    the file pays the CLI's start-up once; by case, its folder and what its command did."""
    base = tmp_path_factory.mktemp("hostile")
    cases: dict[str, tuple[Path, Case]] = {}
    for i, (args, _) in enumerate(SAMPLING):
        (base / f"sampling{i}").mkdir()
        cases[f"sampling{i}"] = (base / f"sampling{i}", Case(["infer", "1+1=", *args, "--run",
                                                                str(base / f"sampling{i}" / "run")]))
    (base / "evaluate").mkdir()
    cases["evaluate"] = (base / "evaluate", Case(["evaluate", "--count", "5", "--temperature", "nan", "--run",
                                                  str(base / "evaluate" / "run")]))
    (base / "file").write_text("x")
    for key, run in (("file", base / "file"), ("component", base / "file" / "run")):
        cases[key] = (base, Case(["infer", "1+1=", "--run", str(run)]))
    ran = invar_batch([case for _, case in cases.values()], bound_s=120)
    return {key: (folder, out) for (key, (folder, _)), out in zip(cases.items(), ran, strict=True)}


@pytest.mark.parametrize("case", range(len(SAMPLING)), ids=[" ".join(args) for args, _ in SAMPLING])
def test_sampling_options_are_refused_before_any_worker(refusals: Refusals, case: int) -> None:
    folder, out = refusals[f"sampling{case}"]
    assert out.returncode == 2, out.stdout
    assert SAMPLING[case][1] in out.stderr
    assert out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr
    assert not (folder / "run").exists()  # no run, so no worker and no record
    assert out.seconds < 30  # no model was loaded first


def test_evaluate_refuses_nan_temperature_too(refusals: Refusals) -> None:
    folder, out = refusals["evaluate"]
    assert out.returncode == 2
    assert "--temperature nan" in out.stderr
    assert not (folder / "run").exists()


def test_run_directories_that_cannot_be_runs(refusals: Refusals) -> None:
    for key, message in (("file", "is a file, not a folder"), ("component", "a path component is a file")):
        out = refusals[key][1]
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
