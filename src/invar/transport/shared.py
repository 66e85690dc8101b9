"""One worker process for both roles of the training loop: the shared layout's process, seen by the core as two
workers.

Decision: **two channels, not one multiplexed pipe.** The process is started with its inference channel on its
stdin/stdout and its learner channel on a second pair of pipes (`--learner-channel IN,OUT`,
`invar.workers.common.serve_roles`). Each role's client is an ordinary `WorkerClient` on its own channel: its own
handshake and identity (the role's, as in a split run), its own call ids, every report bound to that channel's
call digest and identity digest. A role tag in each call on one pipe would have changed the calls' bytes, and so
their digests, from a split run's; with a channel per role every call and report is byte for byte what a split
run records, and the records of the two layouts differ only in where the roles ran: the pid the two identities
share, and the `placement` metadata that the training runner writes outside the identities (as Ray placement is).

A `SharedProcess` is the transport both roles' workers start at (`invar.engines.Transport`): its `spawn` starts
the process (for whichever role is started first) and hands back the role's channel as a `WorkerProcess`. A
channel ends on its own (its shutdown, or its client closing it): the worker closes that channel's output, so
`wait` returns for that role while the other is still served; the process exits when both have ended. Killing
either role's channel kills the process, so a broken exchange on one role stops both, as one process must. The
process's stderr goes to both clients (each keeps its tail for the messages that name a failed worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, cast

from invar.protocol.messages import Role

_F_SETPIPE_SZ = 1031  # as `invar.transport.client.spawn_local`: a 1 MiB pipe moves large arrays in fewer wake-ups
_BLOCK = 1 << 16


class _Output(io.RawIOBase):
    """A channel's report stream, which notes its end (the worker closed the channel, or the process is gone)."""

    def __init__(self, fd: int, on_end: threading.Event) -> None:
        self._file = open(fd, "rb", buffering=0, closefd=True)  # noqa: SIM115 (closed by `close`)
        self._on_end = on_end

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._file.fileno()

    def readinto(self, buf: Any) -> int:
        n = self._file.readinto(buf)
        if not n:
            self._on_end.set()
        return n or 0

    def close(self) -> None:
        self._file.close()
        super().close()


class _Channel:
    """One role's view of the shared process: the `WorkerProcess` its client drives."""

    def __init__(self, host: SharedProcess, role: Role) -> None:
        self.host, self.role = host, role
        self.ended = threading.Event()
        self.stdin: IO[bytes] | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.host.process.pid

    def poll(self) -> int | None:
        """The process's exit code once it has exited; 0 once this channel has ended while the process serves the
        other role; None while this channel is open."""
        code = self.host.process.poll()
        if code is None and self.ended.is_set():
            code = 0
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.host.process.poll()
            if code is None and self.ended.is_set():
                # A channel that ended because the process died is seen dead a moment later.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.host.process.wait(0.05)
                code = self.host.process.poll() or 0
            if code is not None:
                self.returncode = code
                return code
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.host.argv, timeout or 0.0)
            self.ended.wait(0.05 if left is None else min(0.05, left))

    def kill(self) -> None:
        """Kill the process (both roles): a role's exchange that broke leaves nothing in it to trust."""
        self.host.kill()


class SharedProcess:
    """The one worker process that serves the inference and the learner role of a training run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels = {role: _Channel(self, role) for role in Role}
        self._opened: set[Role] = set()
        self._started: tuple[list[str], dict[str, str] | None, str | None] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr_lock = threading.Lock()
        self._stderr_out: dict[Role, int] = {}

    @property
    def restarts(self) -> int:
        """A lost shared process is not replaced: the run stops (and resumes)."""
        return 0

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> _Channel:
        """The channel of the role `argv` starts (`invar.engines.worker_argv`: `--role inference|learner`), the
        process started by whichever role comes first (`invar.engines.Transport`)."""
        return self.open(_role(argv), argv, env, cwd)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("the shared worker process has not been started")
        return self._process

    @property
    def argv(self) -> list[str]:
        return [] if self._started is None else self._started[0]

    def open(self, role: Role, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> _Channel:
        """The channel of `role`, starting the process if the other role has not; `OSError` if the two roles'
        command lines differ other than in their role, or the role was started before."""
        line = _as_inference(argv, role)
        with self._lock:
            if role in self._opened:
                raise OSError(None, f"the {role.value} role of this shared worker process was started already")
            wanted = (line, None if env is None else dict(env), cwd)
            if self._started is None:
                self._start(*wanted)
            elif self._started != wanted:
                raise OSError(None, "the inference and learner roles of a shared worker process must start with the "
                                    "same command line and environment, but for their role")
            self._opened.add(role)
            return self._channels[role]

    def _start(self, argv: list[str], env: dict[str, str] | None, cwd: str | None) -> None:
        calls_r, calls_w = os.pipe()  # the learner channel: core → worker
        reports_r, reports_w = os.pipe()  # worker → core
        for fd in (calls_w, reports_r):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
        try:
            proc = subprocess.Popen([*argv, "--learner-channel", f"{calls_r},{reports_w}"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, bufsize=0,
                                    start_new_session=True, pass_fds=(calls_r, reports_w))
        except BaseException:
            os.close(calls_w)
            os.close(reports_r)
            raise
        finally:  # the worker's ends: only the worker holds them
            os.close(calls_r)
            os.close(reports_w)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, 1 << 20)
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._started = (argv, env, cwd)
        self._process = proc
        inference, learner = self._channels[Role.INFERENCE], self._channels[Role.LEARNER]
        inference.stdin = proc.stdin
        inference.stdout = cast(IO[bytes], _Output(os.dup(proc.stdout.fileno()), inference.ended))
        proc.stdout.close()
        learner.stdin = open(calls_w, "wb", buffering=0)  # noqa: SIM115 (the client closes it)
        learner.stdout = cast(IO[bytes], _Output(reports_r, learner.ended))
        for channel in (inference, learner):
            read, write = os.pipe()
            channel.stderr = open(read, "rb", buffering=0)  # noqa: SIM115 (the client closes it)
            self._stderr_out[channel.role] = write
            threading.Thread(target=self._close_stderr_at_end, args=(channel,), daemon=True,
                             name=f"shared-{channel.role.value}-end").start()
        threading.Thread(target=self._copy_stderr, name="shared-stderr", daemon=True).start()

    def _copy_stderr(self) -> None:
        """Copy the process's stderr to each role's until the process closes it."""
        proc = self.process
        assert proc.stderr is not None
        while block := proc.stderr.read(_BLOCK):
            with self._stderr_lock:
                for role, fd in list(self._stderr_out.items()):
                    try:
                        _write_all(fd, block)
                    except OSError:  # that role's client stopped reading
                        self._drop_stderr(role)
        with self._stderr_lock:
            for role in list(self._stderr_out):
                self._drop_stderr(role)
        proc.stderr.close()
        for channel in self._channels.values():  # the process has closed every stream: no channel is left
            channel.ended.set()

    def _close_stderr_at_end(self, channel: _Channel) -> None:
        # A role's stderr ends with its channel, so its client's stderr reader is done once the channel is.
        channel.ended.wait()
        with self._stderr_lock:
            self._drop_stderr(channel.role)

    def _drop_stderr(self, role: Role) -> None:
        fd = self._stderr_out.pop(role, None)
        if fd is not None:
            os.close(fd)

    def close(self, timeout: float = 30.0) -> None:
        """After both roles' clients have closed: end a role that was never started (the worker sees the end of its
        input), wait for the process to exit, and kill it if it does not within `timeout`."""
        proc = self._process
        if proc is None:
            return
        with self._lock:
            unopened = [self._channels[role] for role in set(Role) - self._opened]
        for channel in unopened:
            if channel.stdin is not None:
                with contextlib.suppress(OSError):
                    channel.stdin.close()
        # That role's reports stay open until the process has exited: its server may write its handshake only now,
        # and a closed pipe would fail it (EPIPE) and the process with it.
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        for stream in (proc.stdin, self._channels[Role.INFERENCE].stdout, *(c.stdout for c in unopened)):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def kill(self) -> None:
        proc = self._process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _role(argv: Sequence[str]) -> Role:
    roles = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--role"]
    if len(roles) != 1 or roles[0] not in set(Role):
        raise OSError(None, f"a shared worker's command line must name its role once ({' '.join(argv)})")
    return Role(roles[0])


def _as_inference(argv: Sequence[str], role: Role) -> list[str]:
    """`argv` (`invar.engines.worker_argv` for `role`) as the shared process is started: with `--role inference`,
    which serves the learner too on its second channel."""
    line = list(argv)
    at = [i for i, arg in enumerate(line[:-1]) if arg == "--role" and line[i + 1] == role.value]
    if len(at) != 1:
        raise OSError(None, f"a shared worker's command line must name its role once ({' '.join(line)})")
    line[at[0] + 1] = Role.INFERENCE.value
    return line


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
