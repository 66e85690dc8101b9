"""Decision receipts: in-toto statements in DSSE envelopes, anchored at the run's head, signed with Ed25519, verified
from a folder holding only the run, the contract, the receipt and the public key. The refusals of malformed receipts
are in test_receipt_refusals.py; a verifier written from the DSSE and in-toto specifications is in test_dsse.py."""

from __future__ import annotations

import base64
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids
from support.cli_batch import InvarSession
from support.disks import fill

from invar import canonical
from invar.contract.admit import admit
from invar.contract.receipt import (
    PREDICATE_TYPE,
    RECEIPT_SCHEMA,
    load_private_key,
    make_receipt,
    new_key_pair,
    read_receipt,
    verify_receipt,
    write_receipt,
)
from invar.errors import EvidenceError, InvarError, RecordError
from invar.records.store import GENESIS, _chain


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=300) as session:
        yield session


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("receipt"), units=300, requirement={"epsilon": "0.1"})


def _violated_run(ws: Workspace, path: Path) -> Path:
    """A run the contract rejects: the candidate gets 120 more units wrong (loss increase 0.4 > ε = 0.1)."""
    return RunWriter(ws, path, keep_inputs=True).complete(candidate_wrong=unit_ids(ws, 120)).close()


def test_signed_receipt_verifies_from_a_fresh_folder(cli: InvarSession, ws: Workspace, tmp_path: Path) -> None:
    run = _violated_run(ws, tmp_path / "run")
    keys = tmp_path / "keys"
    made = cli.run("keys", "new", "--out", str(keys), "--name", "owner", "--json")
    assert made.returncode == 0, made.stderr
    out = cli.run("use", "admit", str(run), "--contract", str(ws.contract_path), "--receipt",
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
    ok = cli.run("use", "verify", "receipt.json", "--run", "run", "--contract", "c.contract.json",
                 "--public-key", "owner.pub", "--json", cwd=fresh)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["verified"], doc["answer"], doc["signed"], doc["key_checked"]) == (True, "Violated", True, True)
    assert (doc["format"], doc["trust"], doc["warning"]) == (PREDICATE_TYPE, "public-key", None)
    # Without --public-key, verify refuses unless told to trust the key the receipt carries, and then says so.
    bare = cli.run("use", "verify", "receipt.json", "--run", "run", "--contract", "c.contract.json", cwd=fresh)
    assert bare.returncode == 2, bare.stderr
    assert bare.stderr.count("\n") == 1, bare.stderr
    assert "pass --public-key with the issuer's .pub file to check who signed it, or --trust-embedded-key" in \
        bare.stderr
    trusting = cli.run("use", "verify", "receipt.json", "--run", "run", "--contract", "c.contract.json",
                       "--trust-embedded-key", cwd=fresh)
    assert trusting.returncode == 0, trusting.stderr
    assert "anyone could have signed it" in trusting.stdout
    as_json = cli.run("use", "verify", "receipt.json", "--run", "run", "--contract", "c.contract.json",
                      "--trust-embedded-key", "--json", cwd=fresh)
    doc = json.loads(as_json.stdout)
    assert (doc["key_checked"], doc["trust"]) == (False, "embedded-key")
    assert "anyone could have signed it" in doc["warning"]


def test_rechained_forgery_turning_violated_into_admitted_is_caught_by_the_receipt(ws: Workspace,
                                                                                   tmp_path: Path) -> None:
    run = _violated_run(ws, tmp_path / "run")
    receipt = tmp_path / "receipt.json"
    write_receipt(receipt, make_receipt(admit(ws.contract_path, run), contract=ws.contract_path))
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
        verify_receipt(receipt, run, ws.contract_path, trust_embedded_key=True)


def _resigned(envelope: dict[str, object], statement: dict[str, object], key_path: Path) -> dict[str, object]:
    """The envelope with `statement` as its payload, signed again with the key at `key_path`, as a forger holding
    the key (or a careless issuer) would."""
    from invar.contract.receipt import PAYLOAD_TYPE, pae

    payload = json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    sig = load_private_key(key_path).sign(pae(PAYLOAD_TYPE, payload))
    signatures = [{**envelope["signatures"][0], "sig": base64.b64encode(sig).decode()}]  # type: ignore[index]
    return {**envelope, "payload": base64.b64encode(payload).decode(), "signatures": signatures}


def _statement(envelope: dict[str, object]) -> dict[str, object]:
    return json.loads(base64.b64decode(envelope["payload"]))  # type: ignore[arg-type,no-any-return]


def test_a_changed_receipt_or_another_key_is_refused(ws: Workspace, tmp_path: Path) -> None:
    run = _violated_run(ws, tmp_path / "run")
    key_path, _pub, _fp = new_key_pair(tmp_path / "k", "a")
    _k2, other_pub, _fp2 = new_key_pair(tmp_path / "k", "b")
    receipt = make_receipt(admit(ws.contract_path, run), load_private_key(key_path), contract=ws.contract_path)
    # Edited and signed again by the key's holder: the signature is good, the records say otherwise.
    statement = _statement(receipt)
    statement["predicate"]["answer"] = "Admitted"  # type: ignore[index]
    write_receipt(tmp_path / "edited.json", _resigned(receipt, statement, key_path))
    with pytest.raises(EvidenceError, match=r"statement\.predicate\.answer is 'Admitted' in the receipt"):
        verify_receipt(tmp_path / "edited.json", run, ws.contract_path, _pub)
    # A subject's digest changed: another model named than the one decided on.
    statement = _statement(receipt)
    names = [entry["name"] for entry in statement["subject"]]  # type: ignore[attr-defined]
    model = names.index("candidate/model")
    statement["subject"][model]["digest"]["sha256"] = "0" * 64  # type: ignore[index]
    write_receipt(tmp_path / "subject.json", _resigned(receipt, statement, key_path))
    with pytest.raises(EvidenceError, match=rf"statement\.subject\[{model}\]\.digest\.sha256 is '0000"):
        verify_receipt(tmp_path / "subject.json", run, ws.contract_path, _pub)
    write_receipt(tmp_path / "r.json", receipt)
    with pytest.raises(InvarError, match="not by the key in"):
        verify_receipt(tmp_path / "r.json", run, ws.contract_path, other_pub)
    sig_edited = json.loads(json.dumps(receipt))  # unchanged payload, tampered signature
    sig_edited["signatures"][0]["sig"] = base64.b64encode(bytes(64)).decode()
    write_receipt(tmp_path / "s.json", sig_edited)
    with pytest.raises(InvarError, match="changed after it was signed"):
        verify_receipt(tmp_path / "s.json", run, ws.contract_path, _pub)
    with pytest.raises(InvarError, match="never overwritten"):
        write_receipt(tmp_path / "r.json", receipt)


def test_an_incomplete_run_is_refused_by_admit(ws: Workspace, tmp_path: Path) -> None:
    run = RunWriter(ws, tmp_path / "run").complete().close(closed=False)
    with pytest.raises(EvidenceError, match="the run is incomplete"):
        admit(ws.contract_path, run)


def test_a_full_disk_while_the_receipt_is_written_leaves_no_receipt_and_a_second_try_succeeds(
        cli: InvarSession, ws: Workspace, tmp_path: Path, mount_tmpfs: Callable[[str], Path]) -> None:
    run = _violated_run(ws, tmp_path / "run")
    disk = mount_tmpfs("64k")
    receipt = disk / "receipt.json"
    filler = fill(disk)
    args = ("use", "admit", str(run), "--contract", str(ws.contract_path), "--receipt", str(receipt), "--quiet")
    full = cli.run(*args)
    assert full.returncode == 2, full.stderr
    assert full.stderr.count("\n") == 1
    assert f"{receipt}: cannot write the receipt (No space left on device)" in full.stderr
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no cut receipt, no temporary file
    filler.unlink()
    again = cli.run(*args)
    assert again.returncode == 10, again.stderr
    ok = cli.run("use", "verify", str(receipt), "--run", str(run), "--contract", str(ws.contract_path),
                 "--trust-embedded-key")
    assert ok.returncode == 0, ok.stderr
    assert "signature: none: the receipt is not signed: anyone could have written it" in ok.stdout


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
