"""What the chain proves alone, and what the closing record and the head anchor add.

A forger with the project's own functions can rewrite a report and re-chain every record after it, or cut the tail:
the chain alone still verifies. These tests pin down exactly that, and that the closing record and an anchor kept
outside the store catch each.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from support.cli_batch import InvarSession

from invar import canonical
from invar.errors import RecordError
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore
from invar.records.store import GENESIS, _chain

IDENT = Identity("test", {"invar": "test"}, Role.INFERENCE, {"threads": 1}, ("echo",), 42)


def _closed_run(path: Path, n: int = 4) -> str:
    store = RunStore.create(path)
    key = store.record_worker(IDENT.to_wire())
    for i in range(1, n + 1):
        d = store.record_call(canonical.encode(Call(i, "echo", {"x": i}).to_wire()), worker=key)
        store.record_report(canonical.encode(Report(i, d, key, result={"x": i}).to_wire()), worker=key)
    head = store.close_run()
    store.close()
    return head


def _rechain(db: Path, seq: int, new_body: bytes | None, *, drop_from: int | None = None) -> None:
    """What a forger with this project's functions can do: replace one body (or drop the tail from `drop_from`),
    then recompute every digest and chain value after it, so that the chain verifies again."""
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER log_no_update")
    conn.execute("DROP TRIGGER log_no_delete")
    if drop_from is not None:
        conn.execute("DELETE FROM log WHERE seq >= ?", (drop_from,))
    if new_body is not None:
        conn.execute("UPDATE log SET body = ?, digest = ? WHERE seq = ?", (new_body, canonical.sha256(new_body), seq))
    prev = GENESIS
    rows = conn.execute("SELECT seq, kind, worker, digest, body, at_ns FROM log ORDER BY seq").fetchall()
    for rseq, kind, worker, digest, body, at_ns in rows:
        if kind == "close":  # restate the closing record's figures, as a careful forger would
            msg = canonical.decode(body)
            msg["previous_chain"] = prev
            body = canonical.encode(msg)
            digest = canonical.sha256(body)
            conn.execute("UPDATE log SET body = ?, digest = ? WHERE seq = ?", (body, digest, rseq))
        prev = _chain(prev, rseq, kind, worker, digest, at_ns)
        conn.execute("UPDATE log SET chain = ? WHERE seq = ?", (prev, rseq))
    conn.commit()
    conn.close()


def test_closing_record_and_head(tmp_path: Path) -> None:
    head = _closed_run(tmp_path / "run")
    with RunStore.open(tmp_path / "run") as s:
        v = s.verify(expect_head=head)
    assert v.closed
    assert v.head == head
    assert (v.records, v.calls, v.reports) == (11, 4, 4)


def test_a_closed_run_takes_no_more_records(tmp_path: Path) -> None:
    _closed_run(tmp_path / "run")
    with pytest.raises(RecordError, match="the run is closed"):
        RunStore.open(tmp_path / "run", writable=True)


def test_rechained_forgery_passes_the_chain_but_not_the_anchor(tmp_path: Path) -> None:
    db = tmp_path / "run" / "records.sqlite"
    head = _closed_run(tmp_path / "run")
    conn = sqlite3.connect(db)
    call_digest, worker = conn.execute("SELECT digest, worker FROM log WHERE seq = 5").fetchone()
    conn.close()
    forged = canonical.encode(Report(2, call_digest, worker, result={"x": 999}).to_wire())
    _rechain(db, 6, forged)
    with RunStore.open(tmp_path / "run") as s:
        v = s.verify()  # the chain alone cannot tell: this is what the anchor is for
        assert v.closed
        assert s.calls()[1].report is not None
        assert s.calls()[1].report.report.result == {"x": 999}
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError, match="re-chained, cut or extended"):
        s.verify(expect_head=head)


def test_cut_tail_reads_incomplete_and_fails_the_anchor(tmp_path: Path) -> None:
    db = tmp_path / "run" / "records.sqlite"
    head = _closed_run(tmp_path / "run")
    _rechain(db, 0, None, drop_from=9)  # drop the last call, its report and the closing record
    with RunStore.open(tmp_path / "run") as s:
        v = s.verify()
        assert not v.closed  # the cut shows as an incomplete run
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError, match="re-chained, cut or extended"):
        s.verify(expect_head=head)


def test_cut_before_a_kept_closing_record_is_caught_without_anchor(tmp_path: Path) -> None:
    db = tmp_path / "run" / "records.sqlite"
    _closed_run(tmp_path / "run")
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER log_no_delete")
    conn.execute("DELETE FROM log WHERE seq IN (9, 10)")
    conn.execute("DROP TRIGGER log_no_update")
    conn.execute("UPDATE log SET seq = 9 WHERE seq = 11")
    conn.commit()
    conn.close()
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError, match=r"record 9 \(close\)"):
        s.verify()


MALFORMED = [
    ("meta", canonical.encode([1, 2, 3])),
    ("meta", canonical.encode({"run": "not a map"})),
    ("meta", canonical.encode({"a": 1, "b": 2})),
    ("worker", canonical.encode({"engine": 1})),
    ("worker", canonical.encode({"engine": "x", "engine_version": {"a": 1}, "role": "inference", "settings": {},
                                 "methods": [], "pid": 1})),
    ("call", canonical.encode({"kind": "call", "call_id": "one", "method": "m", "params": {}})),
    ("call", canonical.encode(["call"])),
    ("report", canonical.encode({"kind": "report"})),
    ("close", canonical.encode({"records": "many"})),
    ("call", b"\x00\x00\x00\x01\xc1"),
    ("call", b"\x00\x00\x00\x05\x81\xc4\x01k\x00"),  # a bytes map key
    ("report", canonical.encode({"kind": np.array([1, 2], dtype=np.int32)})),  # a kind that is an array
]


@pytest.mark.parametrize(("kind", "body"), MALFORMED)
def test_malformed_bodies_are_one_record_error_naming_the_record(tmp_path: Path, kind: str, body: bytes) -> None:
    store = RunStore.create(tmp_path / "run")
    key = store.record_worker(IDENT.to_wire())
    store._append(kind, body, key if kind in ("call", "report") else None)  # well-chained, malformed body
    store.close()
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError, match=rf"record 3 \({kind}\)"):
        s.verify()


def test_deeply_nested_body_is_a_record_error(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    key = store.record_worker(IDENT.to_wire())
    nested = b"\x91" * 5000 + b"\x00"  # 5000 nested one-element arrays, as raw msgpack
    store._append("call", len(nested).to_bytes(4, "big") + nested, key)
    store.close()
    with RunStore.open(tmp_path / "run") as s, pytest.raises(RecordError, match=r"record 3 \(call\)"):
        s.verify()


def test_second_writer_is_refused_and_creation_is_exclusive(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = RunStore.create(run)
    with pytest.raises(RecordError, match="another invar process is writing this run"):
        RunStore.open(run, writable=True)
    first.close()
    again = RunStore.open(run, writable=True)  # the lock went with the writer
    again.close()
    # Two creators at one instant: exactly one wins, the other gets one line.
    results: list[str] = []
    barrier = threading.Barrier(2)

    def create() -> None:
        barrier.wait()
        try:
            RunStore.create(tmp_path / "race").close()
            results.append("ok")
        except RecordError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=create) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r == "ok" for r in results) == [False, True], results


def test_run_paths_that_cannot_be_runs_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(RecordError, match="is a file, not a folder"):
        RunStore.create(tmp_path / "file")
    with pytest.raises(RecordError, match="a path component is a file"):
        RunStore.create(tmp_path / "file" / "run")


@pytest.fixture
def tmpfs(mount_tmpfs: Callable[[str], Path]) -> Path:
    """A small tmpfs, to make read-only media and a full disk real."""
    return mount_tmpfs("256k")


def test_run_on_read_only_media_verifies_and_creating_there_is_one_line(tmpfs: Path) -> None:
    run = tmpfs / "run"
    head = _closed_run(run)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with RunStore.open(run) as s:
        assert s.verify(expect_head=head).closed
    with pytest.raises(RecordError, match="read-only"):
        RunStore.create(tmpfs / "new-run")


def test_killed_writer_on_read_only_media_still_verifies(tmpfs: Path) -> None:
    run = tmpfs / "run"
    # A writer that dies without closing (os._exit: no checkpoint), leaving committed records in the WAL only.
    script = (
        "import os, sys\n"
        "from invar import canonical\n"
        "from invar.protocol.messages import Call, Identity, Role\n"
        "from invar.records import RunStore\n"
        "s = RunStore.create(sys.argv[1])\n"
        "k = s.record_worker(Identity('t', {}, Role.INFERENCE, {}, ('echo',), 1).to_wire())\n"
        "s.record_call(canonical.encode(Call(1, 'echo', {'x': 1}).to_wire()), worker=k)\n"
        "os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", script, str(run)]).returncode == 9
    assert (run / "records.sqlite-wal").stat().st_size > 0
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with RunStore.open(run) as s:
        v = s.verify()
        assert (v.calls, v.unanswered, v.closed) == (1, [3], False)


def test_full_disk_is_one_line_and_keeps_what_was_written(tmpfs: Path) -> None:
    run = tmpfs / "run"
    store = RunStore.create(run)
    key = store.record_worker(IDENT.to_wire())
    written = 0
    failure = ""
    for i in range(1, 10_000):
        try:
            store.record_call(canonical.encode(Call(i, "echo", {"pad": "x" * 4000}).to_wire()), worker=key)
        except RecordError as exc:
            failure = str(exc)
            break
        written = i
    assert "cannot write record" in failure
    assert "records up to" in failure
    store.close()
    with RunStore.open(run) as s:
        assert s.verify().calls == written > 0


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=60) as session:
        yield session


def test_crafted_store_corpus_is_refused_by_the_cli_naming_the_record(cli: InvarSession, tmp_path: Path) -> None:
    """The corpus of crafted stores: malformed bodies, a cut tail, re-chained forgeries; `inspect records` refuses
    each with one line naming the record (or, for what only an anchor catches, the head)."""
    for i, (kind, body) in enumerate(MALFORMED):
        run = tmp_path / f"malformed-{i}"
        store = RunStore.create(run)
        key = store.record_worker(IDENT.to_wire())
        store._append(kind, body, key if kind in ("call", "report") else None)
        store.close()
        out = cli.run("inspect", "records", str(run), "--quiet")
        assert out.returncode == 2, (kind, body, out.stdout)
        assert f"record 3 ({kind})" in out.stderr
        assert out.stderr.count("\n") == 1
        assert "Traceback" not in out.stderr
    # A re-chained forgery and a cut tail: consistent alone, refused against the head kept at close.
    forged = tmp_path / "forged"
    head = _closed_run(forged)
    conn = sqlite3.connect(forged / "records.sqlite")
    call_digest, worker = conn.execute("SELECT digest, worker FROM log WHERE seq = 3").fetchone()
    conn.close()
    _rechain(forged / "records.sqlite", 4,
             canonical.encode(Report(1, call_digest, worker, result={"x": 7}).to_wire()))
    cut = tmp_path / "cut"
    cut_head = _closed_run(cut)
    _rechain(cut / "records.sqlite", 0, None, drop_from=9)
    for run, anchor in ((forged, head), (cut, cut_head)):
        assert cli.run("inspect", "records", str(run)).returncode == 0  # the chain alone cannot tell
        out = cli.run("inspect", "records", str(run), "--expect-head", anchor, "--quiet")
        assert out.returncode == 2
        assert "re-chained, cut or extended" in out.stderr
        assert out.stderr.count("\n") == 1
    assert "INCOMPLETE" in cli.run("inspect", "records", str(cut)).stdout
