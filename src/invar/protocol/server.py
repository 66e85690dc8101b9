"""The worker's side of the protocol: a small library every engine worker in `workers/` serves its methods with.

The worker's real stdout is kept for frames alone: at start, file descriptor 1 is duplicated for the protocol and
then pointed at stderr, so that whatever an engine prints (vLLM logs to stdout) lands in the log, not in the stream.
A method that raises is answered with an error report (the exception's type and message) and the worker keeps
serving; only a broken stream ends it.

One process may serve both roles of the training loop (`serve_together`): one channel (a pair of pipes) per role,
each with its own handshake, identity and calls, the methods run one at a time, so each channel reads exactly as a
worker process of that role would.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import os
import queue
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, NoReturn

from invar import canonical
from invar.errors import ProtocolError
from invar.protocol import frames
from invar.protocol.messages import PROTOCOL_VERSION, Call, ErrorInfo, Handshake, Identity, Kind, Report, Role
from invar.worker_code import WorkerCodeError, code_digest

Handler = Callable[[dict[str, Any]], dict[str, Any]]
"""A method as the server runs it: the call's params map in, the result map out (`invar.protocol.methods.serves`
makes one of a typed method)."""


class MethodError(Exception):
    """Raised by a method for bad input; its message goes back to the core as is (no traceback)."""


def take_stdout() -> BinaryIO:
    """Reserve the process's stdout for frames and send everything else printed there to stderr."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def _worker_code() -> dict[str, str] | None:
    """The running worker module, the sha256 of its file and its worker code digest (`invar.worker_code`, over the
    module and the core modules it imports, on this process's search path): the records say which code answered."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    code: dict[str, str] = {"module": spec.name if spec is not None else os.path.basename(path),
                            "sha256": canonical.file_sha256(path)}
    # A module that is not on its own search path (run from a file) states no digest, and so pins nothing.
    if spec is not None:
        with contextlib.suppress(WorkerCodeError):
            code["digest"] = code_digest(spec.name, sys.path)
    return code


def _die_with_parent() -> None:
    """Stop this worker, and every process it started, when the process that started it goes away.

    A killed `invar` cannot close its workers; without this they would run on until they next read their input.
    The client starts each worker as the leader of its own process group, so killing the group takes an engine's
    own subprocesses (vLLM's engine core) with it. A worker not leading its group (run by hand) only exits itself.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                if os.getpgrp() == os.getpid():
                    os.killpg(0, signal.SIGKILL)
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exit_worker(code: int) -> NoReturn:
    """End a worker process that has finished serving, with exit status `code`.

    The atexit handlers run (temporary folders, an engine's own shutdown), the streams are flushed, and the process
    exits without finalising every module: with torch loaded that teardown takes ~2 s per worker and does nothing a
    finished worker needs. A process that still has a multiprocessing child (vLLM's spawned engine core) or a
    thread at work exits the ordinary way, so they stop as their owners arrange.
    """
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.active_children():
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Server:
    """Serve `methods` under `identity` on the given streams (the process's own by default)."""

    def __init__(
        self,
        *,
        engine: str,
        engine_version: Mapping[str, str],
        role: Role,
        settings: Mapping[str, Any],
        methods: Mapping[str, Handler],
    ) -> None:
        self.methods = dict(methods)
        self.identity = Identity(
            engine=engine,
            engine_version=dict(engine_version),
            role=role,
            settings=dict(settings),
            methods=tuple(sorted(self.methods)),
            pid=os.getpid(),
            worker=_worker_code(),
            instance=secrets.token_hex(16),  # a pid recurs; each start of a server is named afresh
        )
        self.identity_digest = self.identity.digest
        self.turn: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        """Held while a method runs: a lock shared with the other role's server when one process serves both."""

    def serve(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
        """Run until end of input or a shutdown message; returns the process exit code."""
        if stdin is None and stdout is None:
            _die_with_parent()
        out = stdout if stdout is not None else take_stdout()
        inp = stdin if stdin is not None else sys.stdin.buffer
        self._send(out, Handshake(PROTOCOL_VERSION, self.identity).to_wire())
        while True:
            hasher = hashlib.sha256()
            try:
                payload = frames.read_frame(inp, hasher)
                if payload is None:
                    return 0
                message = frames.decode_payload(payload)
            except ProtocolError as exc:
                log(f"invar worker: stopping on a broken input stream: {exc}")
                return 3
            kind = message.get("kind")
            if not isinstance(kind, str):  # an array here would make the comparisons below ambiguous
                log(f"invar worker: stopping: a message kind must be a string, got {type(kind).__name__}")
                return 3
            if kind == Kind.SHUTDOWN.value:
                return 0
            if kind != Kind.CALL.value:
                log(f"invar worker: stopping: expected a call, got kind {kind!r}")
                return 3
            try:
                call = Call.from_wire(message)
            except ProtocolError as exc:
                log(f"invar worker: stopping on a malformed call: {exc}")
                return 3
            with self.turn:
                answer = self._answer(call, hasher.hexdigest())
            frames.write_parts(out, answer)

    def _answer(self, call: Call, call_digest: str) -> list[bytes | memoryview]:
        """The encoded report for `call`: its result, or its error."""

        def error(kind: str, message: str) -> list[bytes | memoryview]:
            report = Report(call.call_id, call_digest, self.identity_digest, error=ErrorInfo(kind, message))
            return canonical.encode_parts(report.to_wire())

        method = self.methods.get(call.method)
        if method is None:
            served = ", ".join(sorted(self.methods))
            return error("UnknownMethod", f"method {call.method!r} is not served by this worker; it serves: {served}")
        try:
            result = method(call.params)
            # Encoded here, once, so a result that cannot be encoded becomes an error report, not a broken frame.
            return canonical.encode_parts(
                Report(call.call_id, call_digest, self.identity_digest, result=result).to_wire())
        except MethodError as exc:
            return error("BadRequest", str(exc))
        except Exception as exc:
            log(f"invar worker: {call.method} (call {call.call_id}) failed:\n{traceback.format_exc()}")
            return error(type(exc).__name__, str(exc) or repr(exc))

    @staticmethod
    def _send(out: BinaryIO, message: dict[str, Any]) -> None:
        frames.write_parts(out, canonical.encode_parts(message))


def serve_together(channels: Sequence[tuple[Server, BinaryIO, BinaryIO]]) -> int:
    """Serve several servers (one per role) from this process, each on its own channel (input, output); returns the
    process exit code once every channel has ended, or at once when one ends on a broken stream.

    Each channel is a worker of its role on the wire: its own handshake and identity, its own call ids and
    digests. The methods run one at a time, in the order their calls arrive (the engines of one process take
    turns, as a one-process runner's do), while each channel reads its next call. A channel that ends (a shutdown,
    or the end of its input) closes its output, so its client sees the end of its stream while the other role is
    still served.
    """
    _die_with_parent()
    turn = threading.Lock()
    ended: queue.SimpleQueue[int] = queue.SimpleQueue()

    def run(server: Server, inp: BinaryIO, out: BinaryIO) -> None:
        code = 1
        try:
            code = server.serve(inp, out)
            if code == 0:
                out.close()
        except BaseException:  # a bug: the process stops with its traceback on stderr, exit code 1
            log(f"invar worker: the {server.identity.role.value} channel failed:\n{traceback.format_exc()}")
        finally:
            ended.put(code)

    for server, inp, out in channels:
        server.turn = turn
        threading.Thread(target=run, args=(server, inp, out), name=f"serve-{server.identity.role.value}",
                         daemon=True).start()
    for _ in channels:
        code = ended.get()
        if code != 0:
            return code
    return 0


def _channel(text: str) -> tuple[int, int]:
    fds = text.split(",")
    if len(fds) != 2 or not all(fd.isdigit() and int(fd) > 2 for fd in fds):
        raise argparse.ArgumentTypeError(f"expected IN,OUT, two inherited file descriptors above 2; got {text!r}")
    return int(fds[0]), int(fds[1])


def add_channel_argument(parser: argparse.ArgumentParser) -> None:
    """`--learner-channel IN,OUT`: the learner role too, served by this process on its own channel."""
    parser.add_argument("--learner-channel", type=_channel, default=None, metavar="IN,OUT",
                        help="with --role inference: serve the learner role as well, from this process, on the "
                             "inherited file descriptors IN (its calls) and OUT (its reports), with its own "
                             "handshake and identity (the training loop's shared layout)")


def serve_roles(parser: argparse.ArgumentParser, server_for: Callable[[Role], Server], role: Role,
                learner_channel: tuple[int, int] | None) -> int:
    """Serve `role` on stdin/stdout; with `learner_channel`, the learner as well on that channel, each role by its
    own server (`server_for(role)`: its own engine, methods and identity), the methods one at a time."""
    if learner_channel is None:
        return server_for(role).serve()
    if role is not Role.INFERENCE:
        parser.error("--learner-channel: only an inference worker serves the learner as well; pass --role inference")
    inference, learner = server_for(Role.INFERENCE), server_for(Role.LEARNER)
    calls, reports = learner_channel
    return serve_together([(inference, sys.stdin.buffer, take_stdout()),
                           (learner, os.fdopen(calls, "rb"), os.fdopen(reports, "wb", buffering=0))])
