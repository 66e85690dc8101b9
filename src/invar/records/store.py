"""The run store: every call and report of a run, append-only, verifiable from the records alone.

A run is a directory holding one SQLite database (WAL, synchronous=FULL, one transaction per record), so a run
killed at any instant keeps every record committed before the kill. Each record is the exact canonical bytes that
were sent or received, keyed by their sha256, and chained: record k stores sha256 of record k−1's chain value and
its own fields, so an altered, inserted or reordered record is found by `verify`, which names it. Triggers refuse
UPDATE and DELETE; nothing is ever rewritten.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from invar import __version__, canonical
from invar.errors import ProtocolError, RecordError
from invar.protocol.messages import Call, Identity, Kind, Report

DB_NAME = "records.sqlite"
SCHEMA_VERSION = 1
GENESIS = "0" * 64

_SCHEMA = """
CREATE TABLE log(
    seq    INTEGER PRIMARY KEY,
    kind   TEXT    NOT NULL CHECK (kind IN ('meta', 'worker', 'call', 'report')),
    worker TEXT,
    digest TEXT    NOT NULL,
    body   BLOB    NOT NULL,
    at_ns  INTEGER NOT NULL,
    chain  TEXT    NOT NULL
);
CREATE TRIGGER log_no_update BEFORE UPDATE ON log BEGIN SELECT RAISE(ABORT, 'records are append-only'); END;
CREATE TRIGGER log_no_delete BEFORE DELETE ON log BEGIN SELECT RAISE(ABORT, 'records are append-only'); END;
"""


def _chain(prev: str, seq: int, kind: str, worker: str | None, digest: str, at_ns: int) -> str:
    return canonical.digest([prev, seq, kind, worker, digest, at_ns])


@dataclass(frozen=True)
class ReportRecord:
    seq: int
    report: Report
    report_digest: str
    at_ns: int


@dataclass(frozen=True)
class CallRecord:
    """A recorded call, the worker it was sent to, and its report if one came."""

    seq: int
    worker: str
    identity: Identity
    call: Call
    call_digest: str
    at_ns: int
    report: ReportRecord | None = None

    @property
    def name(self) -> str:
        """How messages name this record: its sequence number, call id, method and digest."""
        return f"record {self.seq} (call {self.call.call_id}, {self.call.method}, {self.call_digest[:12]}…)"


@dataclass
class Verification:
    """What `verify` found: counts, and calls that never got a report (a run stopped mid-call)."""

    records: int = 0
    workers: int = 0
    calls: int = 0
    reports: int = 0
    errors: int = 0
    unanswered: list[int] = field(default_factory=list)


class RunStore:
    """One run's records. Create with `RunStore.create`, read with `RunStore.open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, writable: bool) -> None:
        self.path = path
        self._conn = conn
        self._writable = writable
        self._lock = threading.Lock()
        row = conn.execute("SELECT seq, chain FROM log ORDER BY seq DESC LIMIT 1").fetchone()
        self._seq, self._last = (int(row[0]), str(row[1])) if row else (0, GENESIS)
        self._workers: dict[str, Identity] = {}

    # -- opening ----------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None) -> RunStore:
        """Make a new run directory; refuses one that already holds records."""
        root = Path(path)
        db = root / DB_NAME
        if db.exists():
            raise RecordError(f"{root}: a run already exists here; choose a new run directory")
        root.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(_SCHEMA)
        store = cls(root, conn, writable=True)
        store.put_meta("run", {"schema": SCHEMA_VERSION, "invar_version": __version__,
                               "created_ns": time.time_ns(), **dict(meta or {})})
        return store

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = False) -> RunStore:
        """Open an existing run; read-only unless `writable`."""
        root = Path(path)
        db = root / DB_NAME
        if not db.is_file():
            raise RecordError(f"{root}: no run store here (expected {DB_NAME}); pass a run directory")
        try:
            if writable:
                conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            else:
                # Not ?mode=ro: a WAL left by a killed writer must be replayed, which needs the -shm file.
                conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA query_only=ON")
            return cls(root, conn, writable=writable)
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"{db}: the database cannot be read ({exc}); the file is damaged") from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ----------------------------------------------------------------------------------------------

    def _append(self, kind: str, body: bytes, worker: str | None = None) -> str:
        if not self._writable:
            raise RecordError(f"{self.path}: opened read-only")
        digest = canonical.sha256(body)
        with self._lock:
            seq = self._seq + 1
            at_ns = time.time_ns()
            chain = _chain(self._last, seq, kind, worker, digest, at_ns)
            self._conn.execute(
                "INSERT INTO log(seq, kind, worker, digest, body, at_ns, chain) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (seq, kind, worker, digest, body, at_ns, chain),
            )
            self._seq, self._last = seq, chain
        return digest

    def put_meta(self, key: str, value: Any) -> None:
        """Record a metadata entry; a key is written once and never replaced."""
        if key in self.meta():
            raise RecordError(f"{self.path}: metadata {key!r} is already recorded and records are never rewritten")
        self._append("meta", canonical.encode({key: value}))

    def record_worker(self, identity: Mapping[str, Any]) -> str:
        """Record a worker's identity once; returns its digest, the key its calls are recorded under."""
        ident = Identity.from_wire(dict(identity))
        key = ident.digest
        if key not in self._workers and key not in self._known_workers():
            self._append("worker", canonical.encode(ident.to_wire()))
        self._workers[key] = ident
        return key

    def record_call(self, payload: bytes, *, worker: str) -> str:
        """Record a call's exact payload, sent to `worker`; returns the call digest."""
        return self._append("call", payload, worker)

    def record_report(self, payload: bytes, *, worker: str) -> str:
        """Record a report's exact payload, received from `worker`; returns the report digest."""
        return self._append("report", payload, worker)

    def _known_workers(self) -> set[str]:
        return {str(r[0]) for r in self._conn.execute("SELECT digest FROM log WHERE kind = 'worker'")}

    # -- reading ----------------------------------------------------------------------------------------------

    def _rows(self) -> Iterator[tuple[int, str, str | None, str, bytes, int, str]]:
        try:
            yield from self._conn.execute("SELECT seq, kind, worker, digest, body, at_ns, chain FROM log ORDER BY seq")
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"{self.path / DB_NAME}: the database cannot be read ({exc}); "
                              "the file was damaged or tampered with") from None

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for _seq, kind, _w, _d, body, _t, _c in self._rows():
            if kind == "meta":
                out.update(canonical.decode(body))
        return out

    def verify(self) -> Verification:
        """Check every digest, the chain, every binding; raise `RecordError` naming the first bad record."""
        self._verified_calls = self._walk()
        return self._verification

    def calls(self) -> list[CallRecord]:
        """Every call in order, with its report; verifies the whole store first."""
        return self._walk()

    def workers(self) -> dict[str, Identity]:
        self._walk()
        return dict(self._workers)

    def _walk(self) -> list[CallRecord]:
        v = Verification()
        prev = GENESIS
        workers: dict[str, Identity] = {}
        calls: dict[tuple[str, int], CallRecord] = {}
        order: list[tuple[str, int]] = []
        for seq, kind, worker, digest, body, at_ns, chain in self._rows():
            v.records += 1
            where = f"record {seq} ({kind})"
            if seq != v.records:
                raise RecordError(f"{where}: sequence gap, expected record {v.records}: records were removed")
            if canonical.sha256(body) != digest:
                raise RecordError(f"{where}: its bytes do not match its digest {digest[:16]}…: the record was altered")
            if _chain(prev, seq, kind, worker, digest, at_ns) != chain:
                raise RecordError(f"{where}: the chain does not match: the record or one before it was altered")
            prev = chain
            try:
                message = canonical.decode(body)
            except canonical.CanonicalError as exc:
                raise RecordError(f"{where}: undecodable ({exc})") from None
            if canonical.encode(message) != body:
                raise RecordError(f"{where}: not in canonical form")
            try:
                if kind == "worker":
                    ident = Identity.from_wire(message)
                    workers[digest] = ident
                    v.workers += 1
                elif kind == "call":
                    if worker not in workers:
                        raise RecordError(f"{where}: sent to worker {str(worker)[:16]}…, which has no record")
                    if message.get("kind") != Kind.CALL.value:
                        raise RecordError(f"{where}: the body is not a call")
                    call = Call.from_wire(message)
                    key = (worker, call.call_id)
                    if key in calls:
                        raise RecordError(f"{where}: call id {call.call_id} is used twice for one worker")
                    calls[key] = CallRecord(seq, worker, workers[worker], call, digest, at_ns)
                    order.append(key)
                    v.calls += 1
                elif kind == "report":
                    if worker not in workers:
                        raise RecordError(f"{where}: from worker {str(worker)[:16]}…, which has no record")
                    if message.get("kind") != Kind.REPORT.value:
                        raise RecordError(f"{where}: the body is not a report")
                    report = Report.from_wire(message)
                    key = (worker, report.call_id)
                    rec = calls.get(key)
                    if rec is None:
                        raise RecordError(f"{where}: answers call {report.call_id}, which was never recorded")
                    if rec.report is not None:
                        raise RecordError(f"{where}: a second report for {rec.name}")
                    if report.call_digest != rec.call_digest:
                        raise RecordError(f"{where}: bound to call digest {report.call_digest[:16]}…, but "
                                          f"{rec.name} has digest {rec.call_digest[:16]}…")
                    if report.identity_digest != worker:
                        raise RecordError(f"{where}: names identity {report.identity_digest[:16]}…, not the "
                                          f"worker {worker[:16]}… the call was sent to")
                    calls[key] = CallRecord(rec.seq, rec.worker, rec.identity, rec.call, rec.call_digest,
                                            rec.at_ns, ReportRecord(seq, report, digest, at_ns))
                    v.reports += 1
                    v.errors += 0 if report.ok else 1
            except ProtocolError as exc:
                raise RecordError(f"{where}: malformed: {exc}") from None
        v.unanswered = [calls[k].seq for k in order if calls[k].report is None]
        self._workers = workers
        self._verification = v
        return [calls[k] for k in order]


def is_run(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / DB_NAME).is_file()


@contextlib.contextmanager
def open_run(path: str | os.PathLike[str]) -> Iterator[RunStore]:
    store = RunStore.open(path)
    try:
        yield store
    finally:
        store.close()
