"""Decision receipts: anchored at the run's head, signed with Ed25519, verified from a folder holding only the run,
the contract, the receipt and the public key."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids
from support.disks import fill

from invar import canonical
from invar.contract.admit import admit
from invar.contract.receipt import (
    RECEIPT_SCHEMA,
    make_receipt,
    new_key_pair,
    read_receipt,
    verify_receipt,
    write_receipt,
)
from invar.errors import EvidenceError, InvarError, RecordError
from invar.records.store import GENESIS, _chain


def _invar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("receipt"), units=300, requirement={"epsilon": "0.1"})


def _violated_run(ws: Workspace, path: Path) -> Path:
    """A run the contract rejects: the candidate gets 120 more units wrong (loss increase 0.4 > ε = 0.1)."""
    return RunWriter(ws, path, keep_inputs=True).complete(candidate_wrong=unit_ids(ws, 120)).close()


def test_signed_receipt_verifies_from_a_fresh_folder(ws: Workspace, tmp_path: Path) -> None:
    run = _violated_run(ws, tmp_path / "run")
    keys = tmp_path / "keys"
    made = _invar("keys", "new", "--out", str(keys), "--name", "owner", "--json")
    assert made.returncode == 0, made.stderr
    out = _invar("use", "admit", str(run), "--contract", str(ws.contract_path), "--receipt",
                 str(tmp_path / "receipt.json"), "--key", str(keys / "owner.key"), "--json")
    assert out.returncode == 10, out.stderr  # Violated
    assert json.loads(out.stdout)["answer"] == "Violated"
    # A fresh folder with only the run, the contract, the receipt and the public key.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copytree(run, fresh / "run")
    shutil.copy(ws.contract_path, fresh / "c.contract.json")
    shutil.copy(tmp_path / "receipt.json", fresh / "receipt.json")
    shutil.copy(keys / "owner.pub", fresh / "owner.pub")
    ok = _invar("use", "verify", "receipt.json", "--run", "run", "--contract", "c.contract.json",
                "--public-key", "owner.pub", "--json", cwd=fresh)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["verified"], doc["answer"], doc["signed"], doc["key_checked"]) == (True, "Violated", True, True)


def test_rechained_forgery_turning_violated_into_admitted_is_caught_by_the_receipt(ws: Workspace,
                                                                                   tmp_path: Path) -> None:
    run = _violated_run(ws, tmp_path / "run")
    receipt = tmp_path / "receipt.json"
    write_receipt(receipt, make_receipt(admit(ws.contract_path, run)))
    # The forger rewrites every candidate answer to the reference's and re-chains the whole store.
    db = run / "records.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER log_no_update")
    rows = conn.execute("SELECT seq, kind, worker, digest, body, at_ns FROM log ORDER BY seq").fetchall()
    reference_outputs: dict[str, object] | None = None
    prev = GENESIS
    for seq, kind, worker, digest, body, at_ns in rows:
        msg = canonical.decode(body) if kind in ("report", "close") else None
        if kind == "report" and "outputs" in msg.get("result", {}):
            if reference_outputs is None:
                reference_outputs = {o["request_id"]: o for o in msg["result"]["outputs"]}
            else:
                msg["result"]["outputs"] = [reference_outputs[o["request_id"]] for o in msg["result"]["outputs"]]
                body = canonical.encode(msg)
        if kind == "close":
            msg["previous_chain"] = prev
            body = canonical.encode(msg)
        digest = canonical.sha256(body)
        prev = _chain(prev, seq, kind, worker, digest, at_ns)
        conn.execute("UPDATE log SET body = ?, digest = ?, chain = ? WHERE seq = ?", (body, digest, prev, seq))
    conn.commit()
    conn.close()
    # Without an anchor the forgery succeeds: the chain verifies and the answer flips. This is stated in
    # docs/records.md; the anchor is the remedy.
    forged = admit(ws.contract_path, run)
    assert forged.answer.value == "Admitted", forged.reason
    with pytest.raises(RecordError, match="re-chained, cut or extended"):
        verify_receipt(receipt, run, ws.contract_path)


def test_a_changed_receipt_or_another_key_is_refused(ws: Workspace, tmp_path: Path) -> None:
    run = _violated_run(ws, tmp_path / "run")
    key_path, _pub, _fp = new_key_pair(tmp_path / "k", "a")
    _k2, other_pub, _fp2 = new_key_pair(tmp_path / "k", "b")
    from invar.contract.receipt import load_private_key

    receipt = make_receipt(admit(ws.contract_path, run), load_private_key(key_path))
    edited = json.loads(json.dumps(receipt))
    edited["receipt"]["answer"] = "Admitted"
    write_receipt(tmp_path / "edited.json", edited)
    with pytest.raises(EvidenceError, match=r"receipt\.answer is 'Admitted' in the receipt"):
        verify_receipt(tmp_path / "edited.json", run, ws.contract_path)
    write_receipt(tmp_path / "r.json", receipt)
    with pytest.raises(InvarError, match="not by the key in"):
        verify_receipt(tmp_path / "r.json", run, ws.contract_path, other_pub)
    sig_edited = json.loads(json.dumps(receipt))
    sig_edited["receipt"]["reason"] = sig_edited["receipt"]["reason"]  # unchanged body, tampered signature
    sig_edited["signature"]["value"] = "00" * 64
    write_receipt(tmp_path / "s.json", sig_edited)
    with pytest.raises(InvarError, match="changed after it was signed"):
        verify_receipt(tmp_path / "s.json", run, ws.contract_path)
    with pytest.raises(InvarError, match="never overwritten"):
        write_receipt(tmp_path / "r.json", receipt)


def test_an_incomplete_run_is_refused_by_admit(ws: Workspace, tmp_path: Path) -> None:
    run = RunWriter(ws, tmp_path / "run").complete().close(closed=False)
    with pytest.raises(EvidenceError, match="the run is incomplete"):
        admit(ws.contract_path, run)


def test_a_full_disk_while_the_receipt_is_written_leaves_no_receipt_and_a_second_try_succeeds(
        ws: Workspace, tmp_path: Path, mount_tmpfs: Callable[[str], Path]) -> None:
    run = _violated_run(ws, tmp_path / "run")
    disk = mount_tmpfs("64k")
    receipt = disk / "receipt.json"
    filler = fill(disk)
    args = ("use", "admit", str(run), "--contract", str(ws.contract_path), "--receipt", str(receipt))
    full = _invar(*args)
    assert full.returncode == 2, full.stderr
    assert full.stderr.count("\n") == 1
    assert f"{receipt}: cannot write the receipt (No space left on device)" in full.stderr
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no cut receipt, no temporary file
    filler.unlink()
    again = _invar(*args)
    assert again.returncode == 10, again.stderr
    ok = _invar("use", "verify", str(receipt), "--run", str(run), "--contract", str(ws.contract_path))
    assert ok.returncode == 0, ok.stderr


def test_a_kill_while_the_receipt_is_written_leaves_no_receipt(tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from invar.contract import receipt\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed after the bytes, before they are kept\n"
        "receipt.write_receipt(Path(sys.argv[1]), {'receipt': {'schema': receipt.RECEIPT_SCHEMA}})\n"
    )
    assert subprocess.run([sys.executable, "-c", script, str(receipt)]).returncode == -signal.SIGKILL
    assert not receipt.exists()
    write_receipt(receipt, {"receipt": {"schema": RECEIPT_SCHEMA}, "signature": None})
    assert read_receipt(receipt)["receipt"]["schema"] == RECEIPT_SCHEMA
    with pytest.raises(InvarError, match="receipts are never overwritten"):
        write_receipt(receipt, {"receipt": {"schema": RECEIPT_SCHEMA}, "signature": None})
