"""The core's side of a worker: start the process, handshake, send calls, and accept only bound reports.

A report is accepted only if it answers a call this client sent and has not yet been answered, carries the digest
of that call's exact bytes, and names the identity the worker declared at handshake. Anything else, a malformed
frame, stray bytes on the worker's stdout, a worker that dies or a call that outlives its timeout, fails every call
in flight with one `ProtocolError` and stops the worker: after a broken exchange no later report can be trusted.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, Protocol, overload, runtime_checkable

from invar import canonical
from invar.errors import InvarError, ProtocolError, WorkerError
from invar.protocol import frames
from invar.protocol.messages import Call, Handshake, Identity, Kind, Report, Role, shutdown_message
from invar.protocol.methods import Method, P, R, Wire

_OVERLAP_HASH = 1 << 22  # calls larger than this are hashed while they are written
_F_SETPIPE_SZ = 1031  # Linux: a 1 MiB pipe moves large arrays in fewer wake-ups.
_STDERR_BLOCK = 1 << 16
_STDERR_LINE = 4096  # characters of one stderr line kept for messages; a longer line is cut, marked "…"


class WorkerLost(ProtocolError):
    """The worker's process or its carrier (a Ray actor) is gone: a fresh worker may take over its calls."""


def oom_kills(vmstat: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's out-of-memory killer has ended since boot (`oom_kill` in /proc/vmstat, Linux
    4.13 and later); None where that cannot be read."""
    try:
        with open(vmstat, encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


@runtime_checkable
class WorkerProcess(Protocol):
    """A started worker as the client drives it: its three byte streams and its life (`subprocess.Popen` fits).

    A transport other than a local pipe (a Ray actor relaying a worker on another node) offers the same: the frames
    pass unchanged, so binding and recording stay with the client.
    """

    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


Spawn = Callable[[Sequence[str], "Mapping[str, str] | None", "str | None"], WorkerProcess]
"""Starts a worker's command line with its environment and folder; raises `OSError` if it cannot."""


def spawn_local(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> subprocess.Popen[bytes]:
    """The default transport: the worker as a child process in its own session, over pipes."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=None if env is None else dict(env), cwd=cwd, bufsize=0, start_new_session=True)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, 1 << 20)
    return proc


class Recorder(Protocol):
    """Where a client keeps every call and report (the run store implements this)."""

    def record_worker(self, identity: Mapping[str, Any]) -> str: ...

    def record_call(self, payload: bytes, *, worker: str) -> str: ...

    def record_report(self, payload: bytes, *, worker: str) -> str: ...


@dataclass(frozen=True)
class Answer:
    """A verified report together with the call it answers."""

    call: Call
    call_digest: str
    report: Report
    report_digest: str
    identity: Identity
    elapsed_s: float

    @property
    def result(self) -> dict[str, Any]:
        """The result, or the worker's error raised as `WorkerError`."""
        if self.report.error is not None:
            raise WorkerError(self.call.method, self.report.error.type, self.report.error.message)
        assert self.report.result is not None
        return self.report.result


class PendingCall:
    """A call in flight; `answer()` waits for its verified report."""

    def __init__(self, client: WorkerClient, call: Call, digest: str, timeout: float | None) -> None:
        self._client = client
        self.call = call
        self.call_digest = digest
        self.timeout = timeout
        self._sent = time.perf_counter()
        self._done = threading.Event()
        self._digest_ready = threading.Event()
        self._digest_ready.set()
        self._answer: Answer | None = None
        self._failure: InvarError | None = None

    def _resolve(self, report: Report, report_digest: str, identity: Identity) -> None:
        self._answer = Answer(self.call, self.call_digest, report, report_digest, identity,
                              time.perf_counter() - self._sent)
        self._done.set()

    def _fail(self, failure: InvarError) -> None:
        self._failure = failure
        self._done.set()

    def answer(self) -> Answer:
        if not self._done.wait(self.timeout):
            self._client._abort(ProtocolError(
                f"{self._client.name}: call {self.call.call_id} ({self.call.method}) got no report within "
                f"{self.timeout:g} s; the worker was stopped"))
        if self._failure is not None:
            raise self._failure
        assert self._answer is not None
        return self._answer

    def result(self) -> dict[str, Any]:
        return self.answer().result


class WorkerClient:
    """One worker subprocess speaking the invocation protocol.

    Calls may be submitted while others are in flight; the worker answers them in any order and each report is
    matched to its call by id and digest.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str = "worker",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        expected_role: Role | None = None,
        expected_engine: str | None = None,
        handshake_timeout: float = 120.0,
        call_timeout: float | None = 600.0,
        recorder: Recorder | None = None,
        stderr_tail_lines: int = 40,
        echo_stderr: bool = False,
        spawn: Spawn = spawn_local,
    ) -> None:
        self.argv = list(argv)
        self._spawn = spawn
        self.name = name
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._expected_role = expected_role
        self._expected_engine = expected_engine
        self._handshake_timeout = handshake_timeout
        self.call_timeout = call_timeout
        self._recorder = recorder
        self._echo = echo_stderr
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=stderr_tail_lines)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: dict[int, PendingCall] = {}
        self._answered: set[int] = set()
        self._next_id = 1
        self._failure: InvarError | None = None
        """What stopped the exchange: a `ProtocolError`, or the recorder's `RecordError` (a report that could not be
        kept, a full disk) raised to every caller as it is."""
        self._closing = False
        self._proc: WorkerProcess | None = None
        self._identity: Identity | None = None
        self._identity_digest = ""
        self._worker_key = ""
        self._reader: threading.Thread | None = None
        self._stderr_reader: threading.Thread | None = None
        self._oom_kills = oom_kills()

    # -- life cycle -------------------------------------------------------------------------------------------

    @property
    def identity(self) -> Identity:
        if self._identity is None:
            raise ProtocolError(f"{self.name}: not started")
        return self._identity

    @property
    def process(self) -> WorkerProcess | None:
        """The started worker (a `subprocess.Popen`, or another transport's process)."""
        return self._proc

    @property
    def worker_key(self) -> str:
        """The identity digest under which the recorder keeps this worker's records."""
        return self._worker_key

    def start(self) -> Identity:
        try:
            self._proc = self._spawn(self.argv, self._env, self._cwd)
        except OSError as exc:
            raise ProtocolError(f"{self.name}: cannot start {self.argv[0]!r}: {exc.strerror or exc}") from None
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._stderr_reader = threading.Thread(target=self._read_stderr, name=f"{self.name}-stderr", daemon=True)
        self._stderr_reader.start()

        box: list[Handshake | BaseException] = []

        def read_handshake() -> None:
            try:
                assert self._proc is not None
                assert self._proc.stdout is not None
                payload = frames.read_frame(self._proc.stdout)
                if payload is None:
                    raise WorkerLost("end of stream before the handshake")
                box.append(Handshake.from_wire(frames.decode_payload(payload, "handshake")))
            except BaseException as exc:
                box.append(exc)

        t = threading.Thread(target=read_handshake, daemon=True)
        t.start()
        t.join(self._handshake_timeout)
        if not box:
            self._kill()
            raise ProtocolError(f"{self.name}: no handshake within {self._handshake_timeout:g} s"
                                f"{self._stderr_suffix()}")
        got = box[0]
        if isinstance(got, BaseException):
            self._kill()
            self._stderr_reader.join(timeout=2)
            if isinstance(got, ProtocolError):
                refusal = self._start_refusal()
                if refusal is not None:
                    raise type(got)(f"{self.name}: the worker refused to start: {refusal}") from None
                raise type(got)(f"{self.name}: bad handshake: {got}{self._exit_suffix()}") from None
            raise got
        identity = got.identity
        if self._expected_role is not None and identity.role != self._expected_role:
            self._kill()
            raise ProtocolError(f"{self.name}: worker serves as {identity.role.value}, "
                                f"expected {self._expected_role.value}")
        if self._expected_engine is not None and identity.engine != self._expected_engine:
            self._kill()
            raise ProtocolError(f"{self.name}: worker is engine {identity.engine!r}, expected "
                                f"{self._expected_engine!r}")
        self._identity = identity
        self._identity_digest = identity.digest
        self._worker_key = self._identity_digest
        if self._recorder is not None:
            self._worker_key = self._recorder.record_worker(identity.to_wire())
        self._reader = threading.Thread(target=self._read_reports, name=f"{self.name}-reader", daemon=True)
        self._reader.start()
        return identity

    def __enter__(self) -> WorkerClient:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self, timeout: float = 30.0) -> int | None:
        """Ask the worker to finish and exit; kill it if it does not. Returns its exit code."""
        proc = self._proc
        if proc is None:
            return None
        with self._lock:
            self._closing = True
        if proc.poll() is None and self._failure is None:
            try:
                self._write_parts(canonical.encode_parts(shutdown_message()))
                assert proc.stdin is not None
                proc.stdin.close()
            except (OSError, ProtocolError):
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        else:
            self._kill()
        for t in (self._reader, self._stderr_reader):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=5)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return proc.returncode

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            if isinstance(proc, subprocess.Popen):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, 9)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    # -- calls ------------------------------------------------------------------------------------------------

    def submit(self, method: str | Method[Any, Any], params: Mapping[str, Any] | Wire, *,
               timeout: float | None = -1.0) -> PendingCall:
        """Send a call without waiting; `timeout` -1 means the client's default, None means none. `method` is a
        method of the table (`invar.protocol.methods`) with its params struct, or a name with the params map."""
        if self._identity is None:
            raise ProtocolError(f"{self.name}: not started")
        with self._lock:
            if self._failure is not None:
                raise self._failure
            call_id = self._next_id
            self._next_id += 1
        name = method if isinstance(method, str) else method.name
        wire = dict(params) if isinstance(params, Mapping) else params.to_wire()
        call = Call(call_id=call_id, method=name, params=wire)
        parts = canonical.encode_parts(call.to_wire())
        size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
        if self._recorder is not None or size < _OVERLAP_HASH:
            digest = canonical.sha256_parts(parts)
            if self._recorder is not None:
                # The record is written before the call leaves, so a worker that dies mid-call leaves it on record.
                self._recorder.record_call(b"".join(parts), worker=self._worker_key)
            pending = PendingCall(self, call, digest, self.call_timeout if timeout == -1.0 else timeout)
            with self._lock:
                self._pending[call_id] = pending
            self._write_parts(parts)
            return pending
        # A large call with no recorder: hash it on a second thread while it is written (both release the GIL).
        box: list[str] = []
        hasher = threading.Thread(target=lambda: box.append(canonical.sha256_parts(parts)), daemon=True)
        hasher.start()
        pending = PendingCall(self, call, "", self.call_timeout if timeout == -1.0 else timeout)
        pending._digest_ready.clear()
        with self._lock:
            self._pending[call_id] = pending
        try:
            self._write_parts(parts)
        finally:
            hasher.join()
            pending.call_digest = box[0]
            pending._digest_ready.set()
        return pending

    @overload
    def call(self, method: Method[P, R], params: P, *, timeout: float | None = -1.0) -> R: ...

    @overload
    def call(self, method: str, params: Mapping[str, Any], *, timeout: float | None = -1.0) -> dict[str, Any]: ...

    def call(self, method: str | Method[Any, Any], params: Mapping[str, Any] | Wire, *,
             timeout: float | None = -1.0) -> Any:
        """Send a call and return its result, or raise the worker's error as `WorkerError`: `method`'s result
        struct for a method of the table (`EvidenceError` naming the field where the result is not its shape), the
        result map for a method named by a string."""
        result = self.submit(method, params, timeout=timeout).result()
        return result if isinstance(method, str) else method.received(result)

    def ask(self, method: str | Method[Any, Any], params: Mapping[str, Any] | Wire, *,
            timeout: float | None = -1.0) -> Answer:
        """Send a call and return the whole verified answer (result or error, digests, timing)."""
        return self.submit(method, params, timeout=timeout).answer()

    def _write_parts(self, parts: list[bytes | memoryview]) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        try:
            with self._write_lock:
                frames.write_parts(proc.stdin, parts)
        except (BrokenPipeError, ValueError, OSError):
            # The reader sees the death and says why; wait briefly for that richer message.
            if self._reader is not None:
                self._reader.join(timeout=5)
            raise self._failure or WorkerLost(f"{self.name}: cannot write to the worker{self._exit_suffix()}")\
                from None
        except WorkerLost as exc:
            self._abort(WorkerLost(f"{self.name}: {exc}"))
            raise self._failure or exc from None

    # -- the reader -------------------------------------------------------------------------------------------

    def _read_reports(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        stream: IO[bytes] = proc.stdout
        try:
            while True:
                hasher = hashlib.sha256()
                payload = frames.read_frame(stream, hasher)
                if payload is None:
                    break
                self._accept(payload, hasher.hexdigest())
        except ProtocolError as exc:
            # A frame cut short because the worker died is a lost worker, not a worker that broke the protocol.
            kind = WorkerLost if isinstance(exc, WorkerLost) or self._exited(0.5) else ProtocolError
            self._abort(kind(f"{self.name}: {exc}"))
            return
        except InvarError as exc:
            # The recorder could not keep a report (a full disk): the report is lost, so every call in flight fails
            # at once with the recorder's own line, which names the record, instead of waiting out its timeout.
            self._abort(exc)
            return
        except BaseException as exc:
            # A bug: fail the calls in flight at once (never a silent wait for the timeout), and keep its traceback.
            self._abort(ProtocolError(f"{self.name}: the report reader failed ({type(exc).__name__}: {exc})"))
            raise
        # End of stream: a clean exit is fine only if nothing was pending and close() asked for it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if self._stderr_reader is not None:
            self._stderr_reader.join(timeout=2)
        with self._lock:
            closing, pending = self._closing, bool(self._pending)
        if not closing or pending:
            self._abort(WorkerLost(f"{self.name}: worker exited{self._exit_suffix()}"))

    def _accept(self, payload: bytearray | memoryview, report_digest: str) -> None:
        # Strict decoding: what is recorded must be the canonical encoding of what is accepted, or the run's own
        # store would fail verification on the report this command relied on.
        message = frames.decode_payload(payload, "report")
        kind = message.get("kind")
        if not isinstance(kind, str) or kind != Kind.REPORT.value:  # an array's == is elementwise, not a bool
            raise ProtocolError(f"expected a report, got kind {canonical.show(kind)}")
        report = Report.from_wire(message)
        with self._lock:
            pending = self._pending.get(report.call_id)
            if pending is None:
                if report.call_id in self._answered:
                    raise ProtocolError(f"second report for call {report.call_id}, which was already answered")
                raise ProtocolError(f"report for unknown call {report.call_id}")
        pending._digest_ready.wait()
        if report.call_digest != pending.call_digest:
            raise ProtocolError(f"report for call {report.call_id} carries call digest "
                                f"{report.call_digest[:16]}…, but the call sent has {pending.call_digest[:16]}…")
        if report.identity_digest != self._identity_digest:
            raise ProtocolError(f"report for call {report.call_id} names identity {report.identity_digest[:16]}…, "
                                f"not the handshake's {self._identity_digest[:16]}…")
        if self._recorder is not None:
            self._recorder.record_report(bytes(payload), worker=self._worker_key)
        with self._lock:
            del self._pending[report.call_id]
            self._answered.add(report.call_id)
        pending._resolve(report, report_digest, self.identity)

    def _exited(self, within: float) -> bool:
        proc = self._proc
        if proc is None:
            return False
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _abort(self, failure: InvarError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = failure
            failure = self._failure
            pending = list(self._pending.values())
            self._pending.clear()
        self._kill()
        for p in pending:
            p._fail(failure)

    # -- stderr -----------------------------------------------------------------------------------------------

    def _read_stderr(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stderr is not None
        stream = proc.stderr
        # In blocks, never a line at a time: `readline` on an unbuffered pipe is one system call per byte, which a
        # worker that logs a lot outpaces (4 MB of logs took 13 s). The tail keeps whole lines, each cut to a bound.
        read = getattr(stream, "read1", None) or stream.read
        line = bytearray()
        cut = False

        def add(piece: bytes) -> None:
            nonlocal cut
            room = _STDERR_LINE - len(line)
            cut = cut or len(piece) > room
            line.extend(piece[:max(room, 0)])

        while block := read(_STDERR_BLOCK):
            if self._echo:
                os.write(2, block)
            *ended, rest = bytes(block).split(b"\n")
            for piece in ended:
                add(piece)
                self._keep_stderr_line(bytes(line), cut)
                line.clear()
                cut = False
            add(rest)
        if line or cut:
            self._keep_stderr_line(bytes(line), cut)

    def _keep_stderr_line(self, raw: bytes, cut: bool) -> None:
        self._stderr_tail.append(raw.decode("utf-8", "replace").rstrip("\r") + ("…" if cut else ""))

    def _stderr_suffix(self) -> str:
        tail = [line for line in self._stderr_tail if line.strip()][-8:]
        return ("; stderr tail:\n  " + "\n  ".join(tail)) if tail else ""

    def _start_refusal(self) -> str | None:
        """A worker that refuses its launch options exits 2 with one line of its own (`invar.workers.<engine>: …`)
        as its last stderr line: that line is the whole message, without the lines before it."""
        proc = self._proc
        lines = [line for line in self._stderr_tail if line.strip()]
        if proc is None or proc.poll() != 2 or not lines or not lines[-1].startswith("invar.workers."):
            return None
        return lines[-1]

    def _exit_suffix(self) -> str:
        proc = self._proc
        code = proc.poll() if proc is not None else None
        if code == -signal.SIGKILL:
            # Killed outright: by the kernel when memory ran out, which its own counter tells, or by someone else.
            now = oom_kills()
            why = ("killed by the kernel's out-of-memory killer: the machine ran out of memory; give the worker less "
                   "to hold (fewer or shorter items per call) or the machine more memory"
                   if now is not None and self._oom_kills is not None and now > self._oom_kills
                   else "killed by SIGKILL, not by the kernel's out-of-memory killer")
            return f" ({why}; exit code {code})" + self._stderr_suffix()
        return (f" (exit code {code})" if code is not None else "") + self._stderr_suffix()
