"""The worker code is part of what a contract names: a package pins its worker's code digest (the worker module and
the core modules it imports), `use prepare` checks it, `use run` refuses a worker whose files have another digest
before the worker exists, and `use admit` refuses records whose identity names another."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from contract_runs import REFERENCE_IDENTITY, RunWriter, make_workspace

import invar
from invar import canonical, engines
from invar.contract.admit import admit
from invar.engines import ENGINES, start_worker, worker_digest
from invar.errors import ContractError, EvidenceError
from invar.worker_code import WorkerCodeError, code_digest, code_files

SRC = Path(invar.__file__).resolve().parents[1]
HF = "invar.workers.hf_worker"


def _installed_copy(tmp_path: Path) -> Path:
    """A second installation of this core (its `invar` folder copied, bytecode left behind), as a wheel lays it."""
    site = tmp_path / "site"
    shutil.copytree(SRC / "invar", site / "invar", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_home"))
    return site


def _modified_worker(tmp_path: Path) -> Path:
    """A copy of the hf worker, changed (it would answer end-of-sequence to every prompt), on a folder of its own."""
    folder = tmp_path / "modified"
    folder.mkdir()
    source = (SRC / "invar" / "workers" / "hf_worker.py").read_text(encoding="utf-8")
    (folder / "eos_worker.py").write_text(source + "\n# modified: every prompt is answered end-of-sequence\n",
                                          encoding="utf-8")
    return folder


def test_the_digest_covers_the_worker_and_the_core_modules_it_imports(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path)
    here = code_digest(HF, [str(SRC)])
    # The same files under another folder give the same digest: paths are relative to the search-path folder.
    assert code_digest(HF, [str(site)]) == here == worker_digest("hf")
    files = code_files(HF, [str(site)])
    assert {"invar/workers/hf_worker.py", "invar/protocol/server.py", "invar/canonical.py", "invar/__init__.py",
            "invar/workers/__init__.py"} <= set(files)
    assert "invar/contract/admit.py" not in files  # the worker never imports the core's admission
    # Bytecode and modules the worker does not import leave it as it is.
    (site / "invar" / "workers" / "__pycache__").mkdir()
    (site / "invar" / "workers" / "__pycache__" / "hf_worker.cpython-312.pyc").write_bytes(b"\0" * 16)
    (site / "invar" / "contract" / "admit.py").write_text("# edited\n", encoding="utf-8")
    assert code_digest(HF, [str(site)]) == here
    # The worker's own file, and a core module it imports through another, each move it.
    worker = site / "invar" / "workers" / "hf_worker.py"
    worker.write_text(worker.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    edited_worker = code_digest(HF, [str(site)])
    assert edited_worker != here
    frames = site / "invar" / "protocol" / "frames.py"
    frames.write_text(frames.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert code_digest(HF, [str(site)]) not in (here, edited_worker)


def test_a_kept_digest_follows_every_change_to_the_sources_on_the_path(tmp_path: Path) -> None:
    """`worker_digest` keeps what it computed while the `invar` sources on the worker's path stay as they were: an
    edit, a new module a worker's `from X import Y` then names, or a removed file is seen at the next call."""
    site = _installed_copy(tmp_path)
    env = {"PYTHONPATH": str(site)}  # the copy first on the worker's path
    here = worker_digest("hf", env)
    assert worker_digest("hf", env) == here == worker_digest("hf")
    frames = site / "invar" / "protocol" / "frames.py"
    frames.write_text(frames.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    edited = worker_digest("hf", env)
    assert edited not in (here, worker_digest("hf"))
    # `from invar import canonical` in the worker names invar.canonical; a package of that name now answers it.
    (site / "invar" / "canonical").mkdir()
    (site / "invar" / "canonical" / "__init__.py").write_text("# a package shadowing the module\n", encoding="utf-8")
    shadowed = worker_digest("hf", env)
    assert shadowed not in (here, edited)
    assert "invar/canonical/__init__.py" in code_files(HF, [str(site)])
    shutil.rmtree(site / "invar" / "canonical")
    assert worker_digest("hf", env) == edited


def test_the_identity_reports_the_digest_of_the_files_the_core_started() -> None:
    with start_worker("echo", code=(worker_digest("echo"), "reference")) as w:
        assert w.identity.worker is not None
        assert w.identity.worker["digest"] == worker_digest("echo")


def test_a_modified_worker_file_is_refused_before_any_process_starts(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = worker_digest("hf")
    monkeypatch.setitem(ENGINES, "hf", "eos_worker")
    monkeypatch.setenv("PYTHONPATH", str(_modified_worker(tmp_path)))
    spawned: list[Any] = []
    monkeypatch.setattr(engines, "_spawn", lambda *a, **k: spawned.append(a))  # a local or a forked start
    with pytest.raises(WorkerCodeError) as refused:
        start_worker("hf", code=(pinned, "candidate"))
    message = str(refused.value)
    assert "\n" not in message
    assert f"the contract names {pinned}" in message
    assert f"worker digest {worker_digest('hf')}" in message
    assert worker_digest("hf") != pinned
    assert "invar use package hf" in message
    assert spawned == []


def test_use_run_refuses_a_modified_worker_before_its_first_call(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", units=8)
    pinned = ws.contract.reference.worker_digest
    assert pinned == ws.contract.candidate.worker_digest == worker_digest("hf")
    run = tmp_path / "run"
    code = ("import sys; from invar.engines import ENGINES; ENGINES['hf'] = 'eos_worker'; "
            "from invar.cli.app import main; sys.argv[0] = 'invar'; main()")
    env = {**os.environ, "PYTHONPATH": str(_modified_worker(tmp_path))}
    out = subprocess.run([sys.executable, "-c", code, "use", "run", str(ws.contract_path), "--run", str(run)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert re.fullmatch(r"invar: error: the reference worker's code is not the package's: the hf worker's files "
                        rf"\(eos_worker and the invar modules it imports\) have worker digest [0-9a-f]{{64}}, the "
                        rf"contract names {pinned}; .*\n", out.stderr), out.stderr
    assert not run.exists()  # refused before the run was opened: no worker, no record


def test_prepare_pins_the_worker_code_and_refuses_a_declared_digest_it_does_not_have(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", units=8)
    written = json.loads(ws.contract_path.read_bytes())
    assert written["reference"]["worker_digest"] == written["candidate"]["worker_digest"] == worker_digest("hf")
    with pytest.raises(ContractError) as refused:
        make_workspace(tmp_path / "stale", units=8, reference={"worker_digest": "e" * 64})
    assert str(refused.value) == (
        f"reference.worker_digest: the hf worker's code here has worker digest {worker_digest('hf')}, but "
        f"{'e' * 64} was declared; declare this code's digest (invar use package hf prints it) or prepare where "
        "the worker code the digest names is installed")


def test_a_contract_prepared_before_worker_code_was_pinned_keeps_its_digest_and_is_not_run(tmp_path: Path) -> None:
    from invar.contract.model import parse_contract
    from invar.runner.use_run import use_run

    ws = make_workspace(tmp_path / "ws", units=8)
    data = json.loads(ws.contract_path.read_bytes())
    for role in ("reference", "candidate"):
        del data[role]["worker_digest"]
    old = (json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    assert parse_contract(old).canonical_json() == old  # read as it was written: its sha256 does not move
    path = ws.contract_path.with_name("old.contract.json")
    path.write_bytes(old)
    with pytest.raises(ContractError, match=r"^reference\.worker_digest: the contract names no worker code .*prepare "
                                            r"it again from its declaration$"):
        use_run(path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_admission_refuses_records_of_other_worker_code(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", units=8)
    admitted = admit(ws.contract_path, RunWriter(ws, tmp_path / "good").complete().close())
    assert admitted.answer.value == "Unknown"  # the records are accepted; 8 units are too few to admit
    for name, worker in (("other", {"module": HF, "sha256": "0" * 64, "digest": "f" * 64}),
                         ("older", {"module": HF, "sha256": "0" * 64})):
        writer = RunWriter(ws, tmp_path / name)
        ref = writer.worker("reference", {**REFERENCE_IDENTITY, "worker": worker})
        cand = writer.worker("candidate")
        for planned in ws.plan.calls:
            writer.generate(ref if planned.package == "reference" else cand, planned)
        with pytest.raises(EvidenceError) as refused:
            admit(ws.contract_path, writer.close())
        message = str(refused.value)
        assert "\n" not in message
        if name == "other":
            assert f"package.worker_digest is {'f' * 64!r} in the record, {worker_digest('hf')!r} in the contract" \
                in message, message
        else:
            assert "names no worker code digest (a run made before worker code was pinned)" in message, message


def test_the_worker_code_digest_is_canonical_over_relative_paths(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path)
    files = code_files(HF, [str(site)])
    assert code_digest(HF, [str(site)]) == canonical.digest(
        {rel: canonical.file_sha256(path) for rel, path in files.items()})


def test_a_receipt_names_each_package_s_worker_code(tmp_path: Path) -> None:
    from invar.contract.receipt import subjects

    ws = make_workspace(tmp_path / "ws", units=8)
    decision = admit(ws.contract_path, RunWriter(ws, tmp_path / "run").complete().close())
    named = {s["name"]: s["digest"]["sha256"] for s in subjects(decision, ws.contract)}
    assert named["reference/worker"] == named["candidate/worker"] == worker_digest("hf")


def test_the_shipped_declarations_pin_the_worker_code_installed_here() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "pin_worker_code.py"
    out = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # a worker or a core module it imports changed: re-pin with the script
    for path in sorted((script.parents[1] / "contracts").rglob("*.toml")):  # the script pins the same files
        text = path.read_text(encoding="utf-8")
        assert text.count("worker_digest = ") == 2, path.name  # stated by both packages, not left to use prepare


def test_digests_computed_from_many_threads_at_once_agree() -> None:
    # use run starts its packages' workers from threads, each hashing its worker's code first
    from concurrent.futures import ThreadPoolExecutor

    from invar.engines import worker_digest

    expected = worker_digest("hf")
    with ThreadPoolExecutor(max_workers=8) as pool:
        digests = list(pool.map(lambda _: worker_digest("hf"), range(16)))
    assert set(digests) == {expected}
