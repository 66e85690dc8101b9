"""The run store: append-only, verifiable, and whole after a kill -9 at any instant."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from invar import canonical
from invar.errors import RecordError
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore
from invar.records.store import CallRecord, is_run

WRITER = str(Path(__file__).with_name("writer.py"))
IDENT = Identity("test", {"invar": "test"}, Role.INFERENCE, {"threads": 1}, ("echo",), 42)


def _fill(store: RunStore, n: int) -> list[str]:
    key = store.record_worker(IDENT.to_wire())
    digests = []
    for i in range(1, n + 1):
        call = canonical.encode(Call(i, "echo", {"marker": f"payload-{i:04d}", "x": float(i)}).to_wire())
        d = store.record_call(call, worker=key)
        store.record_report(canonical.encode(Report(i, d, key, result={"x": float(i)}).to_wire()), worker=key)
        digests.append(d)
    return digests


def test_round_trip_and_meta(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run", meta={"contract": "c" * 64})
    digests = _fill(store, 5)
    store.close()
    with RunStore.open(tmp_path / "run") as s:
        v = s.verify()
        assert (v.records, v.workers, v.calls, v.reports, v.unanswered) == (12, 1, 5, 5, [])
        assert [c.call_digest for c in s.calls()] == digests
        assert s.meta()["run"]["contract"] == "c" * 64


def test_refuses_existing_run_and_missing_run(tmp_path: Path) -> None:
    RunStore.create(tmp_path / "run").close()
    with pytest.raises(RecordError, match="a run already exists here"):
        RunStore.create(tmp_path / "run")
    with pytest.raises(RecordError, match="no run store here"):
        RunStore.open(tmp_path / "nothing")


def test_metadata_is_never_replaced(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    store.put_meta("contract", "a")
    with pytest.raises(RecordError, match="already recorded"):
        store.put_meta("contract", "b")


def test_update_and_delete_are_refused_by_the_database(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    _fill(store, 2)
    store.close()
    conn = sqlite3.connect(tmp_path / "run" / "records.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE log SET body = x'00' WHERE seq = 3")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM log WHERE seq = 3")
    conn.close()


def _flip_in_file(db: Path, marker: bytes) -> None:
    data = bytearray(db.read_bytes())
    pos = data.find(marker)
    assert pos >= 0, "marker not found in the database file"
    data[pos + len(marker) - 1] ^= 0x01
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("target", [1, 7, 13])
def test_a_flipped_byte_is_reported_with_the_record_named(tmp_path: Path, target: int) -> None:
    store = RunStore.create(tmp_path / "run")
    digests = _fill(store, 20)
    store.close()
    # Fold the WAL into the main file, then flip one byte of one record's body.
    conn = sqlite3.connect(tmp_path / "run" / "records.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    _flip_in_file(tmp_path / "run" / "records.sqlite", f"payload-{target:04d}".encode())
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError) as err:
        s.verify()
    seq = 1 + 1 + 2 * (target - 1) + 1  # run meta, worker, then call/report pairs
    assert f"record {seq} (call)" in str(err.value)
    assert "altered" in str(err.value)
    assert digests[target - 1]


def test_a_forged_record_with_a_fresh_digest_breaks_the_chain(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    _fill(store, 3)
    store.close()
    conn = sqlite3.connect(tmp_path / "run" / "records.sqlite")
    conn.execute("DROP TRIGGER log_no_update")
    body = canonical.encode(Call(2, "echo", {"marker": "forged", "x": 2.0}).to_wire())
    conn.execute("UPDATE log SET body = ?, digest = ? WHERE seq = 5", (body, canonical.sha256(body)))
    conn.commit()
    conn.close()
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError, match=r"record 5 \(call\): the chain"):
        s.verify()


def test_a_report_bound_to_another_call_is_refused(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    key = store.record_worker(IDENT.to_wire())
    d1 = store.record_call(canonical.encode(Call(1, "echo", {}).to_wire()), worker=key)
    store.record_call(canonical.encode(Call(2, "echo", {}).to_wire()), worker=key)
    store.record_report(canonical.encode(Report(2, d1, key, result={}).to_wire()), worker=key)
    with pytest.raises(RecordError, match=r"record 5 \(report\): bound to call digest"):
        store.verify()


def test_a_report_from_another_identity_is_refused(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    key = store.record_worker(IDENT.to_wire())
    d1 = store.record_call(canonical.encode(Call(1, "echo", {}).to_wire()), worker=key)
    store.record_report(canonical.encode(Report(1, d1, "e" * 64, result={}).to_wire()), worker=key)
    with pytest.raises(RecordError, match=r"record 4 \(report\): names identity"):
        store.verify()


@pytest.mark.parametrize("trial", range(6))
def test_kill_minus_nine_keeps_every_committed_record(tmp_path: Path, trial: int) -> None:
    rng = random.Random(trial)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, WRITER, str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # Once it writes (its start-up time varies with the machine's load), let it write for a random while, reading
    # what it says it committed.
    committed: list[str] = [proc.stdout.readline().split()[1]]
    deadline = time.monotonic() + rng.uniform(0.3, 1.5)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            committed.append(line.split()[1])
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate()
    committed += [ln.split()[1] for ln in rest.splitlines() if ln.strip()]
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) > 10
    with RunStore.open(run) as s:
        v = s.verify()
        recorded = {c.call_digest for c in s.calls()} | {c.report.report_digest for c in s.calls() if c.report}
    missing = [d for d in committed if d not in recorded]
    assert not missing, f"{len(missing)} committed records lost"
    # At most one call lacks its report: the one in flight at the kill.
    assert len(v.unanswered) <= 1



def test_a_record_commits_without_waiting_for_the_disk_and_the_closing_record_waits(tmp_path: Path) -> None:
    """What the kill test above relies on, and no more: each record's commit is in the write-ahead log when it returns
    (SQLite synchronous 1, NORMAL), which a killed process leaves with the operating system; the closing record's
    commit syncs the log (2, FULL), so the head handed out as the run's anchor is on the disk with every record
    before it. A store reopened to resume commits without waiting again."""
    store = RunStore.create(tmp_path / "run")
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    store.close()
    store = RunStore.open(tmp_path / "run", writable=True)
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    head = store.close_run()
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    store.close()
    with RunStore.open(tmp_path / "run") as s:
        assert s.verify(expect_head=head).closed

_DIE_WHILE_CREATING = """
import os, signal, sys
from invar.records import store as st

stage = sys.argv[2]


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Dying:
    # The store's connection, killed at one instant of the database's creation.
    def __init__(self, conn):
        self._c = conn

    def execute(self, sql, *args):
        out = self._c.execute(sql, *args)
        if stage == "wal" and "journal_mode" in sql:
            die()
        return out

    def executescript(self, script):
        if stage == "table":  # the table committed, its triggers not yet
            self._c.execute(script.split(";")[0])
            die()
        self._c.executescript(script)
        if stage == "schema":  # the schema committed, the first record not yet
            die()

    def __getattr__(self, name):
        return getattr(self._c, name)


real = st.RunStore._connect
st.RunStore._connect = staticmethod(lambda db, uri=False: die() if stage == "file" else Dying(real(db, uri=uri)))
st.RunStore.create(sys.argv[1])
"""


@pytest.mark.parametrize("stage", ["file", "wal", "table", "schema"])
def test_a_run_killed_while_its_database_is_created_is_made_afresh(tmp_path: Path, stage: str) -> None:
    """kill -9 before the first record commits leaves a database with nothing in it: it is no run (reading it says
    so in one line), and creating the run again in the same folder succeeds."""
    run = tmp_path / "run"
    died = subprocess.run([sys.executable, "-c", _DIE_WHILE_CREATING, str(run), stage])
    assert died.returncode == -signal.SIGKILL
    assert (run / "records.sqlite").is_file()
    assert not is_run(run)
    with pytest.raises(RecordError, match=r"holds no record .* run the command that makes it again"):
        RunStore.open(run)
    with RunStore.create(run, meta={"again": True}) as store:
        assert store.verify().records == 1
    assert is_run(run)
    with RunStore.open(run) as s:
        assert s.meta()["run"]["again"] is True
    with pytest.raises(RecordError, match="a run already exists here"):
        RunStore.create(run)  # once a record is committed, it is a run and is never made afresh


def test_a_damaged_database_is_never_taken_for_an_empty_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.sqlite").write_bytes(b"not a database at all" * 100)
    assert is_run(run)
    with pytest.raises(RecordError, match="a run already exists here"):
        RunStore.create(run)
    assert (run / "records.sqlite").read_bytes().startswith(b"not a database")


def test_calls_decode_with_arrays(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    key = store.record_worker(IDENT.to_wire())
    arr = np.linspace(0, 1, 7, dtype=np.float32)
    store.record_call(canonical.encode(Call(1, "echo", {"a": arr}).to_wire()), worker=key)
    got = store.calls()[0].call.params["a"]
    assert got.tobytes() == arr.tobytes()


def _as_compared(rec: CallRecord) -> tuple[object, ...]:
    """A call record as bytes and numbers (reports hold arrays, which `==` cannot compare)."""
    rep = rec.report
    return (rec.seq, rec.worker, rec.call_digest, rec.at_ns, canonical.encode(rec.call.to_wire()),
            None if rep is None else (rep.seq, rep.report_digest, rep.at_ns, canonical.encode(rep.report.to_wire())))


def test_iter_calls_gives_what_calls_gives_one_at_a_time(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    key = store.record_worker(IDENT.to_wire())
    lost = store.record_call(canonical.encode(Call(1, "echo", {"x": 1.0}).to_wire()), worker=key)  # never answered
    for i in range(2, 6):
        call = canonical.encode(Call(i, "echo", {"a": np.arange(i, dtype=np.float32)}).to_wire())
        d = store.record_call(call, worker=key)
        store.record_report(canonical.encode(Report(i, d, key, result={"a": np.ones(i, np.int32)}).to_wire()),
                            worker=key)
    store.close()
    with RunStore.open(tmp_path / "run") as s:
        streamed = [_as_compared(r) for r in s.iter_calls()]
        assert streamed == [_as_compared(r) for r in s.calls()]
        assert streamed[0][2] == lost
        assert streamed[0][5] is None
        again = s.call_at(4)
        assert again.call.call_id == 2
        assert again.report is not None
        assert _as_compared(again) == streamed[1]
        with pytest.raises(RecordError, match="record 2: no call is recorded there"):
            s.call_at(2)


def test_a_record_changed_after_verification_is_refused_when_read_again(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    _fill(store, 3)
    store.close()
    with RunStore.open(tmp_path / "run") as s:
        s.verify()
        # Rewritten behind the store's back, digest and chain recomputed: the pass that verified saw other bytes.
        conn = sqlite3.connect(tmp_path / "run" / "records.sqlite")
        body = canonical.encode(Report(2, canonical.sha256(b"x"), "k", result={"x": 9.0}).to_wire())
        conn.execute("DROP TRIGGER log_no_update")
        conn.execute("UPDATE log SET body = ?, digest = ? WHERE seq = 6", (body, canonical.sha256(body)))
        conn.commit()
        conn.close()
        with pytest.raises(RecordError, match=r"record 6 \(report\): its bytes are not those verified"):
            list(s.iter_calls())


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "link to a missing file", "folder"])
def test_a_database_that_is_not_a_regular_file_is_refused_by_name_and_kept(tmp_path: Path, kind: str) -> None:
    """Only an empty regular file is a creation that stopped before its first record: a FIFO or a link to a device
    in the database's place is named and left alone, never opened as a database nor removed and made afresh."""
    run = tmp_path / "run"
    run.mkdir()
    db = run / "records.sqlite"
    if kind == "fifo":
        os.mkfifo(db)
    elif kind == "folder":
        db.mkdir()
    else:
        db.symlink_to("/dev/zero" if kind == "link to /dev/zero" else tmp_path / "missing")
    before = os.lstat(db)
    words = {"fifo": "a FIFO", "folder": "a folder"}.get(kind, "a symbolic link")
    assert not is_run(run)
    with pytest.raises(RecordError, match=f"^{re.escape(str(db))}: is {words}, not a regular file; .*move it away"):
        RunStore.create(run)
    with pytest.raises(RecordError, match=f"^{re.escape(str(db))}: is {words}, not a regular file"):
        RunStore.open(run)
    after = os.lstat(db)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


def test_an_identity_from_an_earlier_invocation_is_refused_before_any_call(tmp_path: Path) -> None:
    """A worker that presents the identity an earlier invocation's worker had (its instance repeated) would number
    its calls from 1 under the same key: it is refused, and the run stays readable."""
    ident = Identity("t", {}, Role.INFERENCE, {}, ("echo",), 7, instance="same")
    with RunStore.create(tmp_path / "run") as store:
        key = store.record_worker(ident.to_wire())
        assert store.record_worker(ident.to_wire()) == key  # the same start, recorded once
        store.record_call(canonical.encode(Call(1, "echo", {}).to_wire()), worker=key)
    with RunStore.open(tmp_path / "run", writable=True) as store:
        store.verify()
        with pytest.raises(RecordError, match=r"a worker presents identity [0-9a-f]{16}… \(pid 7\), which a worker "
                                              r"of an earlier invocation of this run already had"):
            store.record_worker(ident.to_wire())
        other = store.record_worker(dataclasses.replace(ident, instance="another").to_wire())
        store.record_call(canonical.encode(Call(1, "echo", {}).to_wire()), worker=other)
        assert store.verify().calls == 2
