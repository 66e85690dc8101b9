"""The run store: every call and report of a run, append-only, verifiable from the records alone.

A run is a directory holding one SQLite database (WAL, one transaction per record), so a run killed at any
instant keeps every record committed before the kill. A record's commit does not wait for the disk (`SYNCHRONOUS`):
a committed record is in the write-ahead log, in the operating system's cache, which a killed process does not take
with it; only an operating-system crash or a power cut can lose the last records, and the database stays whole. The
closing record is the one commit that waits for the disk, since the head it makes is handed out as an anchor.

Each record is the exact canonical bytes that were sent or received, keyed by their sha256, and chained: record k
stores sha256 of record k−1's chain value and its own fields, so an altered, inserted or reordered record is found
by `verify`, which names it. Triggers refuse UPDATE and DELETE; nothing is ever rewritten.

The chain alone cannot catch a forger who rewrites a record and recomputes every digest after it, nor one who cuts
the tail: both leave a store that verifies. Two things close that gap. A finished run ends with a **closing
record** (its counts and the chain value before it), so a cut or killed run reads as incomplete. And the chain value
of the last record, the **head**, is printed when the run closes: whoever keeps it (the contract owner, a receipt)
holds an anchor that any re-chaining, cut or extension changes (`verify(expect_head=...)`).

One process writes a run at a time: a writer holds an exclusive `flock` on `writer.lock` for as long as the store
is open for writing (the kernel releases it when the process dies, so a killed run can be resumed), and a new run's
database file is created with O_EXCL, so two processes creating the same run cannot both succeed. A database whose
creation was killed before its first record committed holds nothing and is no run (`is_run`): creating the run again
makes it afresh.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import itertools
import os
import select
import shutil
import sqlite3
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from invar import __version__, canonical, parallel
from invar.errors import ProtocolError, RecordError
from invar.protocol.messages import Call, Identity, Kind, Report
from invar.records.digests import CallDigest, ReportDigest

DB_NAME = "records.sqlite"
LOCK_NAME = "writer.lock"
SCHEMA_VERSION = 2
"""2: adds the closing record (kind `close`). Stores of schema 1 still verify; they read as not closed."""
GENESIS = "0" * 64
SYNCHRONOUS = "NORMAL"
"""SQLite's `synchronous` for each record's commit (WAL mode). NORMAL: a commit is written to the write-ahead log
before it returns, but not synced; the log is synced at each checkpoint and at the closing record (FULL there).
A process killed at any instant (SIGKILL, out of memory, Ctrl-C) keeps every committed record: the operating system
holds them. An operating-system crash or power cut may lose the records after the last sync; the records left are
a consistent prefix that verifies and resumes. FULL would sync every record (3.6–8 ms each on this disk, about 6 % of a
tiny-model training cycle) to keep them through a power cut as well."""

_SCHEMA = """
CREATE TABLE log(
    seq    INTEGER PRIMARY KEY,
    kind   TEXT    NOT NULL CHECK (kind IN ('meta', 'worker', 'call', 'report', 'close')),
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


def _os_error(path: Path, exc: OSError, what: str) -> RecordError:
    """One line for a file-system failure: where, what the system said, and what to do."""
    reason = exc.strerror or type(exc).__name__
    hint = {
        errno.EROFS: "the file system is read-only; choose a run directory on writable storage",
        errno.ENOSPC: "the disk is full; free space or choose another run directory",
        errno.EACCES: "permission denied; choose a run directory you can write",
        errno.ENOTDIR: "a path component is a file, not a folder; choose another run directory",
        errno.EEXIST: "a file of that name is in the way; choose another run directory",
    }.get(exc.errno or 0, "check the path")
    return RecordError(f"{path}: cannot {what} ({reason}); {hint}")


@dataclass(frozen=True)
class ReportRecord:
    seq: int
    report: Report
    report_digest: ReportDigest
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
    """What `verify` found: counts, calls that never got a report, whether the run was closed, and its head."""

    records: int = 0
    workers: int = 0
    calls: int = 0
    reports: int = 0
    errors: int = 0
    unanswered: list[int] = field(default_factory=list)
    closed: bool = False
    """True when the last record is a closing record whose counts match the records before it."""
    head: str = GENESIS
    """The chain value of the last record: the anchor to keep for this run."""


class RunStore:
    """One run's records. Create with `RunStore.create`, read with `RunStore.open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, writable: bool, lock_fd: int | None = None,
                 scratch: Path | None = None) -> None:
        self.path = path
        self._conn = conn
        self._writable = writable
        self._lock_fd = lock_fd
        self._scratch = scratch
        self._lock = threading.Lock()
        row = conn.execute("SELECT seq, chain, kind FROM log ORDER BY seq DESC LIMIT 1").fetchone()
        self._seq, self._last = (int(row[0]), str(row[1])) if row else (0, GENESIS)
        self._closed = bool(row) and row[2] == "close"
        self._workers: dict[str, Identity] = {}
        self._recorded_here: set[str] = set()
        """The worker identities this store object recorded (a key already on record before it opened is not new)."""
        self._walked: list[CallRecord] | None = None
        self._verification: Verification | None = None
        # From the last verifying pass, for `iter_calls`: each call's and report's digest by seq, and each answered
        # call's report seq (a few hundred bytes per call, never the bodies).
        self._digests: dict[int, str] = {}
        self._report_of: dict[int, int] = {}
        self._counts = {"call": 0, "report": 0}
        self._call_seqs: dict[str, int] = {}
        self._source: tuple[str, bool] | None = None
        """How a store opened read-only was connected to (`_connect`'s arguments): a checking process opens it so."""
        if row:
            for kind, count in conn.execute("SELECT kind, count(*) FROM log GROUP BY kind"):
                if kind in self._counts:
                    self._counts[kind] = int(count)

    # -- opening ----------------------------------------------------------------------------------------------

    @staticmethod
    def _take_writer_lock(root: Path) -> int:
        """Hold the run's writer lock (released by the kernel when this process ends, however it ends)."""
        lock_path = root / LOCK_NAME
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _os_error(lock_path, exc, "open the run's writer lock") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RecordError(f"{root}: another invar process is writing this run; wait for it to finish, "
                              "or choose another run directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    @staticmethod
    def _connect(db: Path | str, *, uri: bool = False) -> sqlite3.Connection:
        return sqlite3.connect(db, isolation_level=None, check_same_thread=False, uri=uri)

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None) -> RunStore:
        """Make a new run directory; refuses one that already holds records, or that another process is making.
        A database left with no record by a creation that was killed is made afresh."""
        root = Path(path)
        db = root / DB_NAME
        if root.exists() and not root.is_dir():
            raise RecordError(f"{root}: is a file, not a folder; choose a new run directory")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(root, exc, "make the run directory") from None
        fd = cls._take_writer_lock(root)
        try:
            _refuse_irregular(db)
            if _holds_no_record(db):
                # A creation killed before its first record committed (kill -9, power loss) left a database with
                # nothing in it; under the writer lock no other process is making it, so it is made afresh.
                _remove_database(db)
            try:
                os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                raise RecordError(f"{root}: a run already exists here; choose a new run directory, or resume it "
                                  "with the command that made it") from None
            except OSError as exc:
                raise _os_error(db, exc, "create the run's database") from None
            try:
                conn = cls._connect(db)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
                conn.executescript(_SCHEMA)
            except sqlite3.Error as exc:
                raise RecordError(f"{db}: cannot initialise the run's database ({exc}); check the disk") from None
            store = cls(root, conn, writable=True, lock_fd=fd)
        except BaseException:
            os.close(fd)
            raise
        store.put_meta("run", {"schema": SCHEMA_VERSION, "invar_version": __version__,
                               "created_ns": time.time_ns(), **dict(meta or {})})
        return store

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = False) -> RunStore:
        """Open an existing run; read-only unless `writable` (which takes the writer lock and refuses a closed
        run, since nothing may follow its closing record)."""
        root = Path(path)
        db = root / DB_NAME
        if not db.is_file():
            _refuse_irregular(db)
            raise RecordError(f"{root}: no run store here (expected {DB_NAME}); pass a run directory")
        if _holds_no_record(db):
            raise RecordError(f"{root}: the run holds no record (its creation was stopped before the first one was "
                              "committed); run the command that makes it again with this run directory, which "
                              "starts it afresh")
        if writable:
            fd = cls._take_writer_lock(root)
            try:
                conn = cls._connect(db)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
                store = cls(root, conn, writable=True, lock_fd=fd)
            except sqlite3.DatabaseError as exc:
                os.close(fd)
                raise RecordError(f"{db}: the database cannot be read ({exc}); the file is damaged") from None
            except BaseException:
                os.close(fd)
                raise
            if store._closed:
                store.close()
                raise RecordError(f"{root}: the run is closed; nothing may be added to it. Start a new run")
            return store
        scratch: Path | None = None
        try:
            if os.access(root, os.W_OK) and os.access(db, os.W_OK):
                # Not ?mode=ro: a WAL left by a killed writer must be replayed, which needs the -shm file.
                conn = cls._connect(db)
                source: tuple[str, bool] = (str(db), False)
            else:
                conn, scratch = cls._open_on_read_only_media(db)
                source = (str(scratch / DB_NAME), False) if scratch is not None else \
                    (f"{db.resolve().as_uri()}?immutable=1", True)
            conn.execute("PRAGMA query_only=ON")
            store = cls(root, conn, writable=False, scratch=scratch)
            store._source = source
            return store
        except sqlite3.DatabaseError as exc:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise RecordError(f"{db}: the database cannot be read ({exc}); the file is damaged") from None

    @classmethod
    def _open_on_read_only_media(cls, db: Path) -> tuple[sqlite3.Connection, Path | None]:
        """A run on media this process cannot write (a read-only mount, an archive): SQLite cannot make its -shm
        file there. Without a write-ahead log the file is complete and is opened immutable; with one (a writer was
        killed), database and log are copied to a scratch folder, where the log is replayed as usual."""
        wal = db.with_name(db.name + "-wal")
        if not wal.exists() or wal.stat().st_size == 0:
            return cls._connect(f"{db.resolve().as_uri()}?immutable=1", uri=True), None
        scratch = Path(tempfile.mkdtemp(prefix="invar-readonly-run-"))
        try:
            shutil.copy2(db, scratch / DB_NAME)
            shutil.copy2(wal, scratch / wal.name)
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise _os_error(db, exc, "copy the run from read-only media to replay its log") from None
        return cls._connect(scratch / DB_NAME), scratch

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ----------------------------------------------------------------------------------------------

    @property
    def head(self) -> str:
        """The chain value of the last record written or read."""
        return self._last

    @property
    def closed(self) -> bool:
        """Whether the last record is a closing record (checked fully by `verify`)."""
        return self._closed

    def _append(self, kind: str, body: bytes, worker: str | None = None) -> str:
        if not self._writable:
            raise RecordError(f"{self.path}: opened read-only")
        digest = canonical.sha256(body)
        with self._lock:
            if self._closed:
                raise RecordError(f"{self.path}: the run is closed; nothing may be added to it")
            seq = self._seq + 1
            at_ns = time.time_ns()
            chain = _chain(self._last, seq, kind, worker, digest, at_ns)
            try:
                self._conn.execute(
                    "INSERT INTO log(seq, kind, worker, digest, body, at_ns, chain) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (seq, kind, worker, digest, body, at_ns, chain),
                )
            except sqlite3.Error as exc:
                # Nothing was committed for this record; every earlier one stays whole (one transaction each).
                raise RecordError(f"{self.path / DB_NAME}: cannot write record {seq} ({kind}): {exc}; records up to "
                                  f"{self._seq} are kept. Free disk space or fix the storage, then resume") from None
            self._seq, self._last = seq, chain
            if kind == "call":
                self._call_seqs[digest] = seq
            if kind in self._counts:
                self._counts[kind] += 1
        return digest

    def put_meta(self, key: str, value: Any) -> None:
        """Record a metadata entry; a key is written once and never replaced."""
        if key in self.meta(key):  # only that entry decoded: the kept inputs are the run's largest
            raise RecordError(f"{self.path}: metadata {key!r} is already recorded and records are never rewritten")
        self._append("meta", canonical.encode({key: value}))

    def record_worker(self, identity: Mapping[str, Any]) -> str:
        """Record a worker's identity once; returns its digest, the key its calls are recorded under."""
        ident = Identity.from_wire(dict(identity))
        key = ident.digest
        if key not in self._recorded_here:
            if key in self._known_workers():
                # An earlier invocation's worker had this identity; this start numbers its calls from 1 again, and
                # the same key would give a call id twice, leaving the run unreadable. Refused before any call.
                raise RecordError(f"{self.path}: a worker presents identity {key[:16]}… (pid {ident.pid}), which a "
                                  "worker of an earlier invocation of this run already had; each start of a worker "
                                  "must name itself afresh (its identity's instance): use a worker that does")
            self._append("worker", canonical.encode(ident.to_wire()))
            self._recorded_here.add(key)
        self._workers[key] = ident
        return key

    def record_call(self, payload: bytes, *, worker: str) -> CallDigest:
        """Record a call's exact payload, sent to `worker`; returns the call digest."""
        return CallDigest(self._append("call", payload, worker))

    def call_seq(self, digest: str) -> int | None:
        """The record (seq) of the call with this digest that this process recorded last; None if it recorded none.
        Identical call bytes recur (a call issued again after its worker was lost), so a record that names a call
        names its seq as well."""
        with self._lock:
            return self._call_seqs.get(digest)

    def record_report(self, payload: bytes, *, worker: str) -> ReportDigest:
        """Record a report's exact payload, received from `worker`; returns the report digest."""
        return ReportDigest(self._append("report", payload, worker))

    def close_run(self) -> str:
        """Append the closing record and return the run's head: the chain value to keep as its anchor.

        The closing record states how many records, calls and reports precede it and the chain value before it, so
        a run cut after it was closed no longer verifies, and a run without one reads as incomplete.
        """
        with self._lock:
            body = canonical.encode({"records": self._seq, "calls": self._counts["call"],
                                     "reports": self._counts["report"], "previous_chain": self._last,
                                     "invar_version": __version__})
            # The head is handed out as the run's anchor: its commit waits for the disk, and with it every record
            # before it (syncing the log syncs all of it).
            self._conn.execute("PRAGMA synchronous=FULL")
        self._append("close", body)
        with self._lock:
            self._closed = True
        return self._last

    def _known_workers(self) -> set[str]:
        return {str(r[0]) for r in self._conn.execute("SELECT digest FROM log WHERE kind = 'worker'")}

    # -- reading ----------------------------------------------------------------------------------------------

    def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[
            tuple[int, str, str | None, str, bytes, int, str]]:
        try:
            # Not `yield from`: closing an abandoned walk would close the cursor, which fails once the store is
            # closed; the rows are simply no longer read.
            cursor = self._conn.execute(
                f"SELECT seq, kind, worker, digest, body, at_ns, chain FROM log {where} ORDER BY seq", args)
            while (row := cursor.fetchone()) is not None:
                yield row
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"{self.path / DB_NAME}: the database cannot be read ({exc}); "
                              "the file was damaged or tampered with") from None

    def meta(self, *only: str) -> dict[str, Any]:
        """The run's metadata entries (not verified: call `verify` first where it matters); with `only`, those of
        these names (an entry of another name is skipped undecoded: a run's kept inputs hold its population)."""
        out: dict[str, Any] = {}
        for seq, _kind, _w, _d, body, _t, _c in self._rows("WHERE kind = 'meta'"):
            if only and _meta_name(body) not in (*only, None):
                continue
            out.update(_meta_entry(seq, body))
        return out

    @property
    def call_count(self) -> int:
        """How many call records the store holds (counted, not verified): the total a pass over its calls reports."""
        return self._counts["call"]

    def verify(self, *, expect_head: str | None = None,
               progress: Callable[[int, int], object] | None = None) -> Verification:
        """Check every digest, the chain, every binding and the closing record; raise `RecordError` naming the
        first bad record. With `expect_head`, also demand that the run's head is that anchor. The records are read
        as a stream and none is kept, so a store of any size verifies in bounded memory. `progress` is told the
        calls verified of the store's calls, from 0 (for a command to show; a pass already made tells it the end)."""
        v = self._verified(progress)
        if expect_head is not None and v.head != expect_head.strip().lower():
            raise RecordError(
                f"{self.path}: the run's head is {v.head}, but the anchor given is {expect_head.strip()}: the records "
                "were re-chained, cut or extended after the anchor was taken (or the anchor is of another run)")
        return v

    def calls(self) -> list[CallRecord]:
        """Every call in order, with its report; verifies the whole store first. Holds every call and report decoded:
        `iter_calls` gives the same records one at a time."""
        return self._walk()

    def iter_calls(self) -> Iterator[CallRecord]:
        """Every call in order with its report, as `calls` gives them, read one at a time so that memory does not
        grow with the run: the whole store is verified first (a streaming pass, as `verify`), then each call and its
        report are read again and must be the very bytes that pass verified (`RecordError` otherwise)."""
        v = self._verified()
        for row in self._rows("WHERE kind = 'call' AND seq <= ?", (v.records,)):
            yield self._call_record(row)

    def call_at(self, seq: int) -> CallRecord:
        """The call recorded at `seq`, with its report, read again as `iter_calls` reads it: it must be a call the last
        verifying pass saw (a store is verified first if it has not been)."""
        v = self._verification if self._verification is not None else self._verified()
        for row in self._rows("WHERE seq = ? AND seq <= ? AND kind = 'call'", (seq, v.records)):
            return self._call_record(row)
        raise RecordError(f"record {seq}: no call is recorded there")

    def _call_record(self, row: tuple[int, str, str | None, str, bytes, int, str]) -> CallRecord:
        seq, _kind, worker, digest, body, at_ns, _chain = row
        message = self._reread(seq, "call", digest, body)
        assert worker is not None  # verified: every call names a recorded worker
        try:
            rec = CallRecord(seq, worker, self._workers[worker], Call.from_wire(message), digest, at_ns)
            rseq = self._report_of.get(seq)
            if rseq is not None:
                for _s, _k, _w, rdigest, rbody, rat_ns, _c in self._rows("WHERE seq = ?", (rseq,)):
                    report = Report.from_wire(self._reread(rseq, "report", rdigest, rbody))
                    rec = replace(rec, report=ReportRecord(rseq, report, ReportDigest(rdigest), rat_ns))
        except ProtocolError as exc:
            raise RecordError(f"record {seq}: malformed: {exc}") from None
        return rec

    def _reread(self, seq: int, kind: str, digest: str, body: bytes) -> Any:
        """A record read again after verification, decoded; `RecordError` unless its bytes are the verified ones."""
        if not isinstance(body, bytes) or self._digests.get(seq) != digest or canonical.sha256(body) != digest:
            raise RecordError(f"record {seq} ({kind}): its bytes are not those verified a moment before: the store "
                              "was changed while it was read")
        return _canonical_body(f"record {seq} ({kind})", body)

    def workers(self) -> dict[str, Identity]:
        self._verified()
        return dict(self._workers)

    def _verified(self, progress: Callable[[int, int], object] | None = None) -> Verification:
        """The verification of the whole store by one streaming pass that keeps no record (a store opened read-only
        by this process: once, as `_walk`); `progress`: see `verify`."""
        total = self._counts["call"]
        if not self._writable and self._verification is not None:
            if progress is not None:
                progress(total, total)
            return self._verification
        digests: dict[int, str] = {}
        report_of: dict[int, int] = {}
        stream = CallStream(self, digests, report_of)
        if progress is None:
            for _ in stream:
                pass
        else:
            progress(0, total)
            for done, _ in enumerate(stream, 1):
                progress(done, total)
        assert stream.verification is not None
        self._verification, self._digests, self._report_of = stream.verification, digests, report_of
        return self._verification

    def _walk(self) -> list[CallRecord]:
        # A store opened read-only by this process is walked once: its verdict cannot change under us, since a
        # writer can only append, and appended records would be a different run state we were not asked about.
        if not self._writable and self._walked is not None:
            return self._walked
        self._walked = self._walk_all()
        return self._walked

    def stream(self, *, kept: bool = False) -> CallStream:
        """Every call with its report, read and verified record by record: `iter` it once.

        Answered calls come in the order their reports were recorded, each as soon as its report is read; calls
        never answered follow at the end. Only calls still awaiting their report are held, so a store of any size
        is read in bounded memory. Each record is verified as `verify` does, and the first bad one raises
        `RecordError`; the whole store has been verified only when the stream is exhausted (its `verification` is
        then set). Several streams of one store may be read side by side. `kept`: once exhausted, the store keeps the
        pass as a verifying pass of its own (each record's digest, a few hundred bytes per call), so that `verify`,
        `iter_calls` and `call_at` of a store opened read-only need no second pass.
        """
        if kept:
            return CallStream(self, {}, {}, kept=True)
        return CallStream(self)

    def _walk_all(self) -> list[CallRecord]:
        digests: dict[int, str] = {}
        report_of: dict[int, int] = {}
        stream = CallStream(self, digests, report_of)
        found = sorted(stream, key=lambda rec: rec.seq)  # call order
        assert stream.verification is not None
        self._verification, self._digests, self._report_of = stream.verification, digests, report_of
        return found

    def _walk_records(self, v: Verification, digests: dict[int, str] | None = None,
                      report_of: dict[int, int] | None = None) -> Iterator[CallRecord]:
        """The walk behind `stream`: fills `v` as it goes (and `digests`, `report_of` for `iter_calls`, when given);
        see `stream`."""
        checker = _Checker.start(self._source) if self._source is not None and parallel.helper_allowed() else None
        try:
            yield from self._walk_checked(v, digests, report_of, checker)
        finally:
            if checker is not None:
                checker.stop()

    def _walk_checked(self, v: Verification, digests: dict[int, str] | None, report_of: dict[int, int] | None,
                      checker: _Checker | None) -> Iterator[CallRecord]:
        """`_walk_records`, each body decoded strictly here or, where `checker`'s process decoded the very same
        bytes strictly, read as the value they hold (`_decode_checked`)."""
        prev = GENESIS
        workers: dict[str, Identity] = {}
        pending: dict[tuple[str, int], CallRecord] = {}
        answered: dict[tuple[str, int], str] = {}  # what messages call each answered call
        close_seen: int | None = None
        for seq, kind, worker, digest, body, at_ns, chain in self._rows():
            v.records += 1
            where = f"record {seq} ({kind})"
            if seq != v.records:
                raise RecordError(f"{where}: sequence gap, expected record {v.records}: records were removed")
            if close_seen is not None:
                raise RecordError(f"{where}: follows the closing record {close_seen}: records were added after the "
                                  "run was closed")
            if not isinstance(body, bytes) or canonical.sha256(body) != digest:
                raise RecordError(f"{where}: its bytes do not match its digest {str(digest)[:16]}…: the record was "
                                  "altered")
            if _chain(prev, seq, kind, worker, digest, at_ns) != chain:
                raise RecordError(f"{where}: the chain does not match: the record or one before it was altered")
            chain_before, prev = prev, chain
            checked = checker is not None and checker.decoded(seq, digest)
            message = _decode_checked(body) if checked else _canonical_body(where, body)
            done: CallRecord | None = None
            try:
                if kind == "meta":
                    _meta_checked(seq, message)  # decoded once: a run's kept inputs hold its population
                elif kind == "close":
                    _check_close(where, message, v, chain_before=chain_before)
                    close_seen = seq
                elif kind == "worker":
                    ident = Identity.from_wire(message)
                    if ident.digest != digest:
                        raise RecordError(f"{where}: the identity does not re-encode to its recorded bytes")
                    workers[digest] = ident
                    v.workers += 1
                elif kind == "call":
                    if worker not in workers:
                        raise RecordError(f"{where}: sent to worker {str(worker)[:16]}…, which has no record")
                    if not isinstance(message, dict) or not _kind_is(message, Kind.CALL):
                        raise RecordError(f"{where}: the body is not a call")
                    call = Call.from_wire(message)
                    key = (worker, call.call_id)
                    if key in pending or key in answered:
                        raise RecordError(f"{where}: call id {call.call_id} is used twice for one worker")
                    pending[key] = CallRecord(seq, worker, workers[worker], call, digest, at_ns)
                    v.calls += 1
                    if digests is not None:
                        digests[seq] = digest
                elif kind == "report":
                    if worker not in workers:
                        raise RecordError(f"{where}: from worker {str(worker)[:16]}…, which has no record")
                    if not isinstance(message, dict) or not _kind_is(message, Kind.REPORT):
                        raise RecordError(f"{where}: the body is not a report")
                    report = Report.from_wire(message)
                    key = (worker, report.call_id)
                    rec = pending.get(key)
                    if rec is None:
                        if key in answered:
                            raise RecordError(f"{where}: a second report for {answered[key]}")
                        raise RecordError(f"{where}: answers call {report.call_id}, which was never recorded")
                    if report.call_digest != rec.call_digest:
                        raise RecordError(f"{where}: bound to call digest {report.call_digest[:16]}…, but "
                                          f"{rec.name} has digest {rec.call_digest[:16]}…")
                    if report.identity_digest != worker:
                        raise RecordError(f"{where}: names identity {report.identity_digest[:16]}…, not the "
                                          f"worker {worker[:16]}… the call was sent to")
                    del pending[key]
                    answered[key] = rec.name
                    done = CallRecord(rec.seq, rec.worker, rec.identity, rec.call, rec.call_digest,
                                      rec.at_ns, ReportRecord(seq, report, ReportDigest(digest), at_ns))
                    v.reports += 1
                    v.errors += 0 if report.ok else 1
                    if digests is not None and report_of is not None:
                        digests[seq] = digest
                        report_of[rec.seq] = seq
                else:
                    raise RecordError(f"{where}: unknown record kind {kind!r}")
            except ProtocolError as exc:
                raise RecordError(f"{where}: malformed: {exc}") from None
            if done is not None:
                yield done
        v.head = prev
        v.closed = close_seen is not None
        v.unanswered = sorted(rec.seq for rec in pending.values())
        self._workers = workers
        yield from sorted(pending.values(), key=lambda rec: rec.seq)


class CallStream:
    """One verified pass over a store's calls (see `RunStore.stream`); `verification` is set once it is exhausted."""

    def __init__(self, store: RunStore, digests: dict[int, str] | None = None,
                 report_of: dict[int, int] | None = None, *, kept: bool = False) -> None:
        self._store = store
        self._index = digests, report_of
        self._kept = kept
        self._v = Verification()
        self._started = False
        self._walk: Iterator[CallRecord] | None = None
        self._first: list[CallRecord] = []
        self.verification: Verification | None = None

    def prime(self) -> None:
        """Read the store now up to its first answered call, which the pass then yields first: the records before it
        (the run's metadata, a run's kept inputs the largest of them) are verified and dropped before the caller
        builds what it holds while the rest is read (admission's plan), not beside it. Raises `RecordError` as the
        pass would; a stream already primed or read is left as it is."""
        if self._walk is None and not self._started:
            self._walk = self._store._walk_records(self._v, *self._index)
            self._first = list(itertools.islice(self._walk, 1))

    def __iter__(self) -> Iterator[CallRecord]:
        if self._started:
            raise RuntimeError("a CallStream is read once; ask the store for another")
        self._started = True
        walk = self._store._walk_records(self._v, *self._index) if self._walk is None else self._walk
        first, self._first = self._first, []
        yield from first
        yield from walk
        self.verification = self._v
        digests, report_of = self._index
        if self._kept and digests is not None and report_of is not None:
            store = self._store
            store._verification, store._digests, store._report_of = self._v, digests, report_of


def _kind_is(message: dict[str, Any], kind: Kind) -> bool:
    value = message.get("kind")  # may be any decoded value, an array included
    return isinstance(value, str) and value == kind.value


def _canonical_body(where: str, body: bytes) -> Any:
    """Decode a record's body; decoding is strict, so only the one canonical encoding of a value decodes."""
    try:
        return canonical.decode(body)
    except canonical.CanonicalError as exc:
        raise RecordError(f"{where}: undecodable ({exc})") from None


def _decode_checked(body: bytes) -> Any:
    """The value of a record's body that `canonical.decode` accepted (in the checking process, the same sha256): the
    same value, read without checking its form again. Arrays are read-only views of `body`, as `decode` gives them."""
    view = memoryview(body)
    doc_end = _DOC_START + int.from_bytes(view[:_DOC_START], "big")
    blobs = doc_end if doc_end == len(view) else doc_end + -doc_end % _ALIGN
    wire, unpack = _WIRE_DTYPES, msgpack.unpackb
    raw = np.frombuffer(view, dtype=np.uint8)  # each array a slice of it, viewed as its dtype (cheaper than a buffer)

    def array(_code: int, payload: bytes) -> Any:
        dtype, shape, offset, nbytes = unpack(payload, raw=False)
        start = blobs + offset
        arr = raw[start:start + nbytes].view(wire[dtype])
        if len(shape) != 1:
            arr = arr.reshape(shape)
        return canonical.BFloat16Array(arr) if dtype == "bfloat16" else arr

    return msgpack.unpackb(view[_DOC_START:doc_end], raw=False, strict_map_key=True, ext_hook=array, timestamp=3)


_DOC_START, _ALIGN, _WIRE_DTYPES = 4, 16, canonical._WIRE_DTYPES  # the layout `canonical.encode` writes
_ENTRY = 40
"""A checked record as the checking process tells it: its seq (8 bytes, big-endian), then its sha256 (32 bytes)."""
_QUIET_S = 30.0
"""How long the walk waits for the checking process to tell the next record before it checks every record itself."""
_CHECKED_UP_TO = 8 << 20
"""The largest body the checking process decodes: a larger one (a run's kept inputs, which hold its population) is
decoded by the walk itself, before the plan is derived (`CallStream.prime`), so that its decoding (several times its
size) is held by neither process beside the other's."""


class _Checker:
    """A forked process that reads a store's records in order and decodes each strictly (`canonical.decode`), ahead
    of the walk: the walk then reads a body that process accepted, with the same sha256, as the value it holds,
    without checking its form a second time, and checks every other body itself (so a refusal is the walk's own,
    word for word, in its place). It runs while the walk reads, binds and scores, on another core."""

    def __init__(self, pid: int, fd: int) -> None:
        self._pid, self._fd = pid, fd
        self._buffer = b""
        self._done: dict[int, bytes] = {}
        self._last = 0  # the last seq the process told
        self._ended = False

    @classmethod
    def start(cls, source: tuple[str, bool]) -> _Checker | None:
        """The process reading the store connected to as `source`, or None where it cannot start."""
        started = parallel.fork_writer(functools.partial(_check_records, source))
        return None if started is None else cls(*started)

    def decoded(self, seq: int, digest: str) -> bool:
        """Whether the process decoded record `seq` strictly, from bytes of sha256 `digest`: waits for it to get
        there (it tells each record in order)."""
        while self._last < seq and not self._ended:
            try:
                # A process silent for _QUIET_S (stopped, or starved on a busy machine) is not waited for: the walk
                # checks the rest itself.
                ready, _, _ = select.select([self._fd], [], [], _QUIET_S)
                chunk = os.read(self._fd, 1 << 16) if ready else b""
            except OSError:
                chunk = b""
            if not chunk:
                self._ended = True
                break
            data = self._buffer + chunk
            whole = len(data) - len(data) % _ENTRY
            for i in range(0, whole, _ENTRY):
                told = int.from_bytes(data[i:i + 8], "big")
                self._done[told] = data[i + 8:i + _ENTRY]
                self._last = told
            self._buffer = data[whole:]
        got = self._done.pop(seq, None)
        return got is not None and got.hex() == digest

    def stop(self) -> None:
        """End the process (done or not) and reap it."""
        os.close(self._fd)  # a process still writing gets a broken pipe and ends
        parallel.kill_and_reap(self._pid)


def _check_records(source: tuple[str, bool], fd: int) -> None:
    """In the checking process: each record of the store at `source`, in order, decoded strictly; the seq and sha256
    of each one `canonical.decode` accepts written to `fd` (a record it refuses, or one over `_CHECKED_UP_TO` bytes,
    is left out: the walk checks it)."""
    conn = sqlite3.connect(source[0], isolation_level=None, uri=source[1])
    out = bytearray()
    for seq, body in conn.execute("SELECT seq, body FROM log ORDER BY seq"):
        if not isinstance(body, bytes) or len(body) > _CHECKED_UP_TO:
            continue
        try:
            canonical.decode(body)
        except canonical.CanonicalError:
            continue
        out += seq.to_bytes(8, "big") + hashlib.sha256(body).digest()
        if len(out) >= 16 * _ENTRY or len(body) >= 1 << 16:  # told often: the walk waits for each record's word
            _write_all(fd, out)
            out.clear()
    _write_all(fd, out)


def _write_all(fd: int, data: bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _meta_name(body: bytes) -> str | None:
    """The name of a metadata record's one entry read from the first bytes of its canonical document (a map of one
    entry under a short name), or None when they are not that (the record is then decoded whole)."""
    # 4 bytes of document length, then msgpack: a fixmap of 1 (0x81) and the name as a fixstr (0xa0 | length).
    if len(body) < 6 or body[4] != 0x81 or not 0xa0 <= body[5] <= 0xbf:
        return None
    try:
        return body[6:6 + (body[5] & 0x1f)].decode()
    except UnicodeDecodeError:
        return None


def _meta_entry(seq: int, body: bytes) -> dict[str, Any]:
    """A metadata record's one {key: value} entry; `RecordError` naming the record for anything else."""
    try:
        entry = canonical.decode(body)
    except canonical.CanonicalError as exc:
        raise RecordError(f"record {seq} (meta): undecodable ({exc})") from None
    return _meta_checked(seq, entry)


def _meta_checked(seq: int, entry: Any) -> dict[str, Any]:
    """A decoded metadata record's one {key: value} entry; `RecordError` naming the record for anything else."""
    if not isinstance(entry, dict) or len(entry) != 1 or not all(isinstance(k, str) for k in entry):
        raise RecordError(f"record {seq} (meta): malformed: a metadata record holds one {{name: value}} entry")
    (key, value), = entry.items()
    if key == "run" and not isinstance(value, dict):
        raise RecordError(f"record {seq} (meta): malformed: the run's metadata must be a map")
    return entry


def _check_close(where: str, message: Any, v: Verification, *, chain_before: str) -> None:
    """A closing record must state exactly the counts and the chain value of the records before it."""
    if not isinstance(message, dict):
        raise RecordError(f"{where}: malformed: a closing record is a map")
    stated = (message.get("records"), message.get("calls"), message.get("reports"), message.get("previous_chain"))
    actual = (v.records - 1, v.calls, v.reports, chain_before)
    if stated != actual:
        raise RecordError(f"{where}: the closing record states {stated[0]} records, {stated[1]} calls, "
                          f"{stated[2]} reports before it, but {actual[0]}, {actual[1]}, {actual[2]} precede it "
                          "(or its chain value differs): records were removed or forged")


def _kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _refuse_irregular(db: Path) -> None:
    """A run's database is a regular file: anything else in its place (a FIFO, a device, a link to one, a folder)
    is refused by name and left where it is, never opened as a database nor removed as an empty one."""
    try:
        mode = os.lstat(db).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _os_error(db, exc, "look at the run's database") from None
    if stat.S_ISREG(mode) or (stat.S_ISLNK(mode) and db.is_file()):
        return  # a link to a regular file (a run kept elsewhere) is read as that file
    raise RecordError(f"{db}: is {_kind_of(mode)}, not a regular file; a run's database is a plain file: move it "
                      "away or choose another run directory")


def _holds_no_record(db: Path) -> bool:
    """Whether `db` is a run database whose creation stopped before its first record committed: an empty regular
    file, no table yet, or an empty `log`. Anything else, a damaged file or one that is not a regular file (a FIFO,
    a device, a link) included, is not (it is refused by name, never removed)."""
    try:
        st = os.lstat(db)
        if not stat.S_ISREG(st.st_mode):
            return False
        if st.st_size == 0 and not _nonempty(db.with_name(db.name + "-wal")):
            return True
    except OSError:
        return False
    if not os.access(db.parent, os.W_OK):
        return False  # not writable here: it could not be made afresh anyway, and opening it says what it holds
    try:
        conn = sqlite3.connect(db, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        conn.execute("PRAGMA query_only=ON")
        tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return True
        if tables != {"log"}:
            return False
        return int(conn.execute("SELECT EXISTS (SELECT 1 FROM log)").fetchone()[0]) == 0
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _remove_database(db: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        part = db.with_name(db.name + suffix)
        try:
            part.unlink(missing_ok=True)
        except OSError as exc:
            raise _os_error(part, exc, "remove the empty database left by an interrupted creation") from None


def is_run(path: str | os.PathLike[str]) -> bool:
    """Whether `path` holds a run: a database with at least one committed record (one whose creation was stopped
    before its first record is no run; `RunStore.create` makes it afresh)."""
    db = Path(path) / DB_NAME
    return db.is_file() and not _holds_no_record(db)
