"""`invar use run` on the real Hugging Face engine: a plan executed exactly, resumed after kills at random instants
to the same decision and the same outputs, and every refusal one line before anything is lost."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_batch import InvarSession
from support.use_runs import decision_figures as _decision_figures
from support.use_runs import outputs_by_call as _outputs_by_call
from train_helpers import live_workers, local_workers_env, worker_pids

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.home import HOME
from invar.patches import patch_digest
from invar.records import RunStore
from invar.runner.engine import Engine, probe_identity

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

pytestmark = pytest.mark.engine

POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"


def _invar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, dict) else \
        "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"


@functools.cache
def _hf_identity() -> Any:
    """The HF worker's identity, probed once for the module (an HF worker start): every declaration here names it."""
    return probe_identity(Engine.HF)


def write_declaration(folder: Path, name: str, *, units: int = 24, per_call: int = 4,
                      candidate: dict[str, Any] | None = None) -> Path:
    """A small HF contract: FP32 reference, NF4 candidate, layouts solo and b4, identities probed from the worker."""
    ident = _hf_identity()
    package = {"engine": "hf", "engine_version": ident.engine_version, "settings": ident.settings,
               "model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
               "dtype": "float32"}
    cand = {**package, "quantization": "nf4", **(candidate or {})}
    lines = [
        f'name = "{name}"',
        "[population]", f'path = "{POPULATION}"',
        f'sha256 = "{POPULATION.with_suffix(".sha256").read_text().split()[0]}"', f"sample = {units}",
        "[scorer]", 'name = "arithmetic-exact"',
        "[sampling]", "temperature = 1.0", "max_tokens = 5",
        "[requirement]", 'standard = "population"', 'epsilon = "0.5"', 'confidence = "0.95"',
        'method = "paired-binary-exact"',
        "[pairing]", "seed = 11", 'layout = "solo"',
        "[layouts.solo]", "batch_size = 1", "[layouts.b4]", "batch_size = 4",
        "[invariance]", "required = true", 'layouts = ["solo", "b4"]',
        "[execution]", f"requests_per_call = {per_call}",
        "[reference]", *(f"{k} = {_toml(v)}" for k, v in package.items()),
        "[candidate]", *(f"{k} = {_toml(v)}" for k, v in cand.items()),
    ]
    decl = folder / f"{name}.toml"
    decl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return decl


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The refusals' command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once. Kills, signals, limits and a second process writing the
    same run keep processes of their own."""
    with InvarSession(bound_s=600) as session:
        yield session


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("use-run")
    decl = write_declaration(folder, "small-nf4")
    out = _invar("use", "prepare", str(decl))
    assert out.returncode == 0, out.stderr
    return folder / "small-nf4.contract.json"


@pytest.fixture(scope="module")
def baseline(contract: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("baseline") / "run"
    out = _invar("use", "run", str(contract), "--run", str(run), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["calls_total"], doc["calls_issued"], doc["calls_reused"]) == (18, 18, 0)
    assert doc["admit"].endswith(f"--expect-head {doc['chain_head']}")
    return run






def test_a_plan_runs_and_is_decided(contract: Path, baseline: Path) -> None:
    out = _invar("use", "admit", str(baseline), "--contract", str(contract), "--json")
    assert out.returncode in (0, 10, 11), out.stderr
    doc = json.loads(out.stdout)
    assert doc["task_loss"]["n"] == 24
    assert len(doc["evidence"]) == 18  # 3 layouts-of-packages × 6 calls of 4 requests
    # Running it again on a closed run changes nothing.
    again = _invar("use", "run", str(contract), "--run", str(baseline), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_closed"] is True


# The CLI killed, then one of its workers, each after a seeded number of recorded calls (of 2 load_model + 18), so
# the kill always lands mid-run whatever the machine's speed. Resume after a worker that dies mid-call, answers an
# error or hangs, and after several losses, is checked in seconds on in-process workers
# (test_fake_worker_orchestration.py); these two keep the claim for real processes of a real engine: SIGKILL, the
# workers of a killed CLI gone, the same outputs bit for bit.
@pytest.mark.parametrize("trial", range(2))
def test_killed_run_resumes_to_the_same_decision_and_outputs(contract: Path, baseline: Path, tmp_path: Path,
                                                             trial: int) -> None:
    rng = random.Random(1000 + trial)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=local_workers_env())
    kill_worker = trial % 2 == 1  # the CLI itself, then one of its workers, mid-call or mid-report
    at_calls = rng.randint(3, 14)
    deadline = time.monotonic() + 300
    while _recorded_calls(run) < at_calls and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    if kill_worker and (pids := live_workers(run, proc.pid)):
        os.kill(rng.choice(pids), signal.SIGKILL)
        proc.wait(60)
    else:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in stderr
    if kill_worker and proc.returncode == 2:
        assert "resume with: invar use run" in stderr
    resumed = _invar("use", "run", str(contract), "--run", str(run), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert _decision_figures(run, contract) == _decision_figures(baseline, contract)
    assert _outputs_by_call(run, contract) == _outputs_by_call(baseline, contract)
    # The workers of the killed CLI did not outlive it.
    for pid in worker_pids(run):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _recorded_calls(run: Path) -> int:
    """Calls on record so far, read beside the writing process (SQLite lets a reader in while it writes)."""
    db = run / "records.sqlite"
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            return int(conn.execute("SELECT count(*) FROM log WHERE kind = 'call'").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is not written yet
        return 0


def test_ctrl_c_stops_issuing_calls_says_what_it_kept_and_the_run_resumes(contract: Path, baseline: Path,
                                                                         tmp_path: Path) -> None:
    # SIGTERM takes the same path (tests/runner/test_fake_worker_orchestration.py; the CLI's line: test_train_hf).
    sig, how = signal.SIGINT, "Ctrl-C"
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _recorded_calls(run) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    at_signal = _recorded_calls(run)
    proc.send_signal(sig)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + sig, stderr[-2000:]
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith(("invar: error", "invar: interrupted"))]
    assert len(lines) == 1, stderr[-2000:]  # the other lines: the phases it went through
    assert lines[0].startswith(f"invar: interrupted: stopped issuing calls at {how} after "), lines[0]
    assert f"resume with: invar use run {contract} --run {run}" in lines[0]
    with RunStore.open(run) as store:
        records = store.calls()
    # Both workers' load_model calls come before any planned call (no call before every worker is checked).
    assert [c.call.method for c in records[:2]] == ["load_model", "load_model"]
    calls = [c for c in records if c.call.method in ("generate", "score")]
    planned_at_signal = at_signal - 2
    # At most the call each of the two workers had under way, or was sending as the signal came, is added.
    assert planned_at_signal <= len(calls) <= planned_at_signal + 2, (planned_at_signal, len(calls))
    assert len(calls) < 18
    assert all(c.report is not None for c in records)  # the calls under way answered within the grace
    print(f"measured: {how} at {planned_at_signal} recorded planned calls, {len(calls)} on record at exit, "
          f"{took:.1f} s to exit")
    for pid in worker_pids(run):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    resumed = _invar("use", "run", str(contract), "--run", str(run), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["calls_reused"] == len(calls)
    assert _decision_figures(run, contract) == _decision_figures(baseline, contract)
    assert _outputs_by_call(run, contract) == _outputs_by_call(baseline, contract)


# A run created but stopped before its inputs were kept gains them on resume: on fake workers
# (test_fake_worker_orchestration.py), the store's meta being the core's alone.


def test_a_run_of_another_contract_is_refused_without_a_resume_hint(cli: InvarSession, contract: Path,
                                                                   tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunStore.create(run, meta={"command": "use run", "contract_sha256": "f" * 64,
                                    "contract": "other.contract.json"}) as store:
        store.close_run()
    out = cli.run("use", "run", str(contract), "--run", str(run))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "the run was made under contract ffffffffffffffff…" in out.stderr
    assert "resume it with the contract it was made under (other.contract.json, as recorded)" in out.stderr
    assert "resume with:" not in out.stderr  # running this command again cannot help: no hint that says it would


def test_a_worker_that_is_not_the_package_is_refused_before_any_call(cli: InvarSession, tmp_path: Path) -> None:
    decl = write_declaration(tmp_path, "foreign", candidate={"engine_version": {"torch": "0.0.1"}})
    assert cli.run("use", "prepare", str(decl)).returncode == 0
    out = cli.run("use", "run", str(tmp_path / "foreign.contract.json"), "--run", str(tmp_path / "run"), "--quiet")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr  # --quiet: the error line alone, no phase before it
    assert "the candidate worker is not the package the contract names: candidate.engine_version" in out.stderr
    with RunStore.open(tmp_path / "run") as store:
        assert store.calls() == []  # neither package's worker was sent a single call
        assert len(store.workers()) >= 1  # the refused identity is on record


def test_bad_inputs_are_one_line(cli: InvarSession, contract: Path, tmp_path: Path) -> None:
    missing = cli.run("use", "run", str(tmp_path / "none.contract.json"), "--run", str(tmp_path / "r1"))
    assert missing.returncode == 2
    assert "cannot read the contract" in missing.stderr
    # A contract changed after use prepare wrote it (still canonical: ε raised from 0.5 to 0.6).
    tampered = contract.with_name("t.contract.json")
    tampered.write_bytes(contract.read_bytes().replace(b'"0.5"', b'"0.6"'))
    tampered.with_name("t.contract.json.sha256").write_text(
        contract.with_name(contract.name + ".sha256").read_text().replace(contract.name, tampered.name))
    out = cli.run("use", "run", str(tampered), "--run", str(tmp_path / "r2"))
    assert out.returncode == 2
    assert "the contract was changed after use prepare wrote it" in out.stderr
    assert not (tmp_path / "r2").exists()
    hand_edited = contract.with_name("h.contract.json")
    hand_edited.write_bytes(contract.read_bytes().replace(b",", b", ", 1))
    out = cli.run("use", "run", str(hand_edited), "--run", str(tmp_path / "r3"))
    assert out.returncode == 2
    assert "not in canonical form" in out.stderr
    (tmp_path / "afile").write_text("x")
    out = cli.run("use", "run", str(contract), "--run", str(tmp_path / "afile"))
    assert out.returncode == 2
    assert "is a file, not a folder" in out.stderr
    for r in (missing, out):
        assert "Traceback" not in r.stderr
        assert r.stderr.count("\n") == 1


def test_a_patch_whose_files_differ_is_refused_before_any_worker(cli: InvarSession, tmp_path: Path) -> None:
    """A patch folder of the user's own: a declaration naming another digest is refused by `use prepare`; prepared
    with its digest and then edited, it is refused by `use run` in one line, before any worker or record."""
    folder = tmp_path / "my-fixed-block"
    shutil.copytree(HOME / "patches" / "fixed-block", folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wrong = write_declaration(tmp_path, "wrong", candidate={"patches": {"./my-fixed-block": "0" * 64}})
    refused = cli.run("use", "prepare", str(wrong))
    assert refused.returncode == 2
    assert f"the patch folder {folder} has digest {patch_digest(folder)}, but {'0' * 64} was declared" in refused.stderr
    assert refused.stderr.count("\n") == 1
    decl = write_declaration(tmp_path, "patched", candidate={"patches": {"./my-fixed-block": patch_digest(folder)}})
    assert cli.run("use", "prepare", str(decl)).returncode == 0
    with (folder / "README.md").open("a", encoding="utf-8") as readme:
        readme.write("An edit after use prepare.\n")
    out = cli.run("use", "run", str(tmp_path / "patched.contract.json"), "--run", str(tmp_path / "run"))
    assert out.returncode == 2
    assert f"the patch folder {folder} has digest" in out.stderr
    assert "its files changed after use prepare" in out.stderr
    assert out.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_store_that_cannot_grow_is_one_line_and_the_run_resumes(contract: Path, baseline: Path,
                                                                  tmp_path: Path) -> None:
    """A full disk, as the store meets it: writes fail part-way (here: a file-size limit on the CLI's process)."""
    import resource

    # Room for the kept inputs (the population file) and about half of the records the whole run writes.
    inputs = POPULATION.stat().st_size
    whole = sum(f.stat().st_size for f in baseline.iterdir())
    cap = inputs + (whole - inputs) // 2

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run)],
                         capture_output=True, text=True, timeout=600, preexec_fn=limit)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "resume with: invar use run" in out.stderr
    with RunStore.open(run) as store:
        kept = store.verify()
    assert not kept.closed
    resumed = _invar("use", "run", str(contract), "--run", str(run), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert _decision_figures(run, contract) == _decision_figures(baseline, contract)


def test_two_workers_per_package_give_the_records_and_decision_of_one_and_a_second_use_run_is_refused(
        contract: Path, baseline: Path, tmp_path: Path) -> None:
    """One run with two workers per package; while it writes its directory, a second `use run` on it is refused and
    the first goes on undisturbed."""
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run),
                              "--workers", "2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (run / "records.sqlite").exists() and first.poll() is None:
        time.sleep(0.05)
    second = _invar("use", "run", str(contract), "--run", str(run))
    assert second.returncode == 2
    assert "another invar process is writing this run" in second.stderr
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    assert json.loads(stdout)["calls_issued"] == 18
    with RunStore.open(run) as store:
        assert store.verify().closed
    assert _decision_figures(run, contract) == _decision_figures(baseline, contract)
    assert _outputs_by_call(run, contract) == _outputs_by_call(baseline, contract)
    with RunStore.open(run) as store:
        workers = store.workers()
        answered_by = {c.worker for c in store.calls() if c.call.method == "generate"}
    assert len(workers) == 4  # two per package, each with its own identity record
    assert len(answered_by) == 4  # and every one of them answered planned calls


def test_workers_below_one_is_one_line_and_starts_nothing(cli: InvarSession, contract: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    for bad in ("0", "-3"):
        out = cli.run("use", "run", str(contract), "--run", str(run), "--workers", bad)
        assert out.returncode == 2
        assert "Traceback" not in out.stderr
        assert f"--workers {bad}: must be ≥ 1" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        assert not run.exists()
