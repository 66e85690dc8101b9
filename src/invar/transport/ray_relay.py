"""Workers placed as Ray actors: the same worker command line, started on a node of an existing Ray cluster.

Decisions:
- **Ray carries bytes, not meaning.** A relay actor starts the worker as a subprocess on its node and moves the raw
  bytes of its stdin, stdout and stderr; the client reads and writes the same frames as over a local pipe. Binding
  (call id, call digest, identity digest) and recording therefore stay in the core's process on the head node.
- **The worker is the one the core would start.** Same argv, same environment (the core's, except what Ray sets
  per node or per actor: Ray's own variables and which accelerators the actor may see). Its identity is what it
  declares at handshake; where it ran (node, actor) is kept in the run's meta, outside the identity.
- **A lost actor is `WorkerLost`**, the client's signal that a fresh worker may take over the unanswered calls.
- **A node may fork its workers.** Where the node's own environment (its `ray start`'s) names a fork server folder
  (`INVAR_FORKSERVER`), the relay asks that server first, under its refusal rules, as a local command does
  (`invar.transport.forkserver`); a refused or absent server is a fresh subprocess, as without one. A forked worker
  dies with the relay's connection (the server kills it when the actor is gone), as a subprocess dies with its actor.
- **Ray is imported only here**, and only when a command is given `--ray`.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

from invar.errors import InvarError
from invar.transport import forkserver
from invar.transport.client import WorkerLost

CONNECT_TIMEOUT_S = 30.0
_CALL_TIMEOUT_S = 30.0  # one relay call that is not a blocking read: a live actor answers at once
_CHUNK = 1 << 20
RELAY_CPUS = 0.01
"""The CPU each relay actor reserves: a token, so that a node started with `--num-cpus 0` (Ray's advice for a head
that drives large jobs) gets no worker, while a node with one CPU still takes a hundred. Ray's SPREAD strategy then
puts a run's workers on different nodes rather than filling one first."""
ACTOR_ENV = {"OMP_NUM_THREADS": "1", "SPT_NOENV": "1"}
"""What Ray sets in every actor's environment, beside its own `RAY_` names and `PYTHONBREAKPOINT`, where the command's
environment does not: a node's fork server started with these (and the command's environment) forks its workers,
since its OpenMP runtime read the same thread count a fresh worker's reads."""
# Variables Ray sets for the node or the actor (accelerator visibility above all): the actor's values stay.
_NODE_KEYS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NEURON_RT_VISIBLE_CORES",
              "TPU_VISIBLE_CHIPS", "ONEAPI_DEVICE_SELECTOR")


def _ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise InvarError("--ray needs the ray package in this environment: pip install 'invar[ray]'") from None
    return ray


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "://" in address:
        return None
    return host.strip("[]"), int(port)


def connect(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Join the Ray cluster at `address` (host:port of its head) as a driver, once per command, within `timeout`.

    An address nobody answers at is one `InvarError`, raised before any worker starts or any record is written.
    """
    def unreachable(why: str) -> InvarError:
        return InvarError(f"--ray {address}: cannot reach a Ray cluster there ({why}); start one with "
                          "'ray start --head' or check the address")

    where = _split(address)
    if where is None:
        raise InvarError(f"--ray {address}: expected HOST:PORT of the cluster's head (the address "
                         "'ray start --head' prints)")
    try:
        socket.create_connection(where, timeout=min(timeout, 5.0)).close()
    except OSError as exc:
        raise unreachable(exc.strerror or str(exc) or type(exc).__name__) from None
    if where[0] in ("127.0.0.1", "localhost", "::1"):
        # A cluster on this machine's loopback: Ray would otherwise give this driver the machine's routable address,
        # which a head started on loopback (as the tests do) does not serve.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = _ray()
    if ray.is_initialized():
        return
    box: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
            box.append(None)
        except BaseException as exc:  # reported by the caller's thread
            box.append(exc)

    _quiet_driver(ray)
    # ray.init may wait a long time on an address that accepts connections but is no Ray head: bound it.
    t = threading.Thread(target=init, name="ray-init", daemon=True)
    # Ray's core logs its connection retries straight to file descriptor 2; a failure is this command's one line.
    saved, sink = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 2)
    try:
        t.start()
        t.join(timeout)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)
    if not box:
        raise unreachable(f"no Ray head answered within {timeout:g} s")
    if box[0] is not None:
        first = str(box[0]).strip().splitlines()
        raise unreachable(f"{type(box[0]).__name__}: {first[0] if first else ''}".rstrip(": "))


def _quiet_driver(ray: Any) -> None:
    """Keep the cluster's messages off this command's stdout (`--json` output) and stderr (one-line errors).

    A Ray driver prints the raylet's error messages (such as an actor's death, which the client reports itself as a
    lost worker) to stdout from a background thread; they go to this module's logger instead.
    """
    log = logging.getLogger(__name__)

    def to_log(data: Mapping[str, Any], ignore_prefix: bool = False) -> None:
        for line in data.get("lines", []):
            log.info("ray %s: %s", data.get("pid"), line)

    private = getattr(getattr(ray, "_private", None), "worker", None)
    if private is not None and hasattr(private, "print_to_stdstream"):
        private.print_to_stdstream = to_log


def _lost(exc: BaseException) -> WorkerLost:
    return WorkerLost(f"the Ray actor relaying the worker is gone ({type(exc).__name__})")


class _Relay:
    """Runs on a Ray node: starts the worker there and moves its bytes (a threaded actor: reads block)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> None:
        merged = dict(os.environ)
        merged.update({k: v for k, v in env.items() if not k.startswith("RAY_") and k not in _NODE_KEYS})
        self._write_lock = threading.Lock()
        # The node's fork server (its environment names the folder, not the command's): its forked worker needs no
        # keeper, since the server kills it when this actor's connection to it closes.
        forked = forkserver.spawn(list(argv), merged, cwd) if os.environ.get(forkserver.ENV) else None
        if forked is not None:
            self._proc: subprocess.Popen[bytes] | forkserver.ForkedWorker = forked
            return
        box: list[subprocess.Popen[bytes] | BaseException] = []
        started = threading.Event()

        def die_with_parent() -> None:
            # The worker must not outlive the actor (ray.kill, a lost node): Linux kills it when the thread that
            # started it ends, and that thread lives as long as the worker does.
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        def keeper() -> None:
            try:
                proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=merged, cwd=cwd, bufsize=0,
                                        preexec_fn=die_with_parent)
            except BaseException as exc:
                box.append(exc)
                started.set()
                return
            box.append(proc)
            started.set()
            proc.wait()

        threading.Thread(target=keeper, name="worker-keeper", daemon=True).start()
        started.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        self._proc = box[0]

    def where(self) -> dict[str, Any]:
        import ray  # type: ignore[import-untyped,unused-ignore]

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call,unused-ignore]
                "actor_id": ctx.get_actor_id(), "actor_pid": os.getpid(), "worker_pid": self._proc.pid}

    def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        with self._write_lock:
            view = memoryview(data)
            while view:
                n = self._proc.stdin.write(view)
                view = view[n or 0:]

    def close_stdin(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()

    def read(self, size: int) -> bytes:
        assert self._proc.stdout is not None
        return os.read(self._proc.stdout.fileno(), size)

    def read_stderr(self, size: int) -> bytes:
        assert self._proc.stderr is not None
        return os.read(self._proc.stderr.fileno(), size)

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)


class _Stdin(io.RawIOBase):
    def __init__(self, process: RayProcess) -> None:
        self._p = process

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._p.get(self._p.actor.write.remote(chunk))
        return len(chunk)

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(WorkerLost, OSError):
                self._p.get(self._p.actor.close_stdin.remote())
        super().close()


class _Stdout(io.RawIOBase):
    def __init__(self, process: RayProcess) -> None:
        self._p = process

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        data = self._p.get(self._p.actor.read.remote(min(len(view), _CHUNK)), timeout=None)
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        # The client closes the streams last: the worker has exited or been stopped, so the relay goes too.
        self._p.release()
        super().close()


class _Stderr(io.RawIOBase):
    def __init__(self, process: RayProcess) -> None:
        self._p = process

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        # In blocks, as the client reads a local worker's stderr: one relay call per block, not per line.
        view = memoryview(buf).cast("B")
        try:
            data: bytes = self._p.get(self._p.actor.read_stderr.remote(min(len(view), _CHUNK)), timeout=None)
        except WorkerLost:
            return 0
        view[:len(data)] = data
        return len(data)


class RayProcess:
    """A worker on a Ray node as the client drives it (`invar.transport.client.WorkerProcess`)."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self._ray = ray
        self.actor = actor
        self.returncode: int | None = None
        self.where: dict[str, Any] = {}
        self.stdin: IO[bytes] | None = cast(IO[bytes], _Stdin(self))
        self.stdout: IO[bytes] | None = cast(IO[bytes], _Stdout(self))
        self.stderr: IO[bytes] | None = cast(IO[bytes], _Stderr(self))
        self._released = False

    def get(self, ref: Any, timeout: float | None = _CALL_TIMEOUT_S) -> Any:
        """A relay call's result; a dead or unreachable actor is `WorkerLost`, a failed write `OSError`."""
        ray = self._ray
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, OSError | ValueError):
                raise OSError(cause.errno if isinstance(cause, OSError) else None, str(cause)) from None
            raise _lost(exc) from None
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise _lost(exc) from None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self.get(self.actor.poll.remote())
            except (WorkerLost, OSError):
                self.returncode = -signal.SIGKILL  # the actor, and the worker with it, is gone
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self.get(self.actor.wait.remote(timeout),
                                           timeout=None if timeout is None else timeout + _CALL_TIMEOUT_S)
            except (WorkerLost, OSError):
                self.returncode = -signal.SIGKILL
            if self.returncode is None:
                raise subprocess.TimeoutExpired("ray worker", timeout or 0.0)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(WorkerLost, OSError):
            self.get(self.actor.kill.remote())
        self.release()
        if self.returncode is None:
            self.returncode = -signal.SIGKILL

    def release(self) -> None:
        """End the relay actor (once)."""
        if not self._released:
            self._released = True
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(self.actor, no_restart=True)


@dataclass(frozen=True)
class RayPlacement:
    """Where workers go: actors on the Ray cluster at `address` (already joined with `connect`)."""

    address: str
    num_gpus: float = 0.0
    """Accelerators each worker's actor asks for (Ray then makes only those visible to the worker)."""
    restarts: int = 3
    """How many times a command may replace one lost worker before it stops."""

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> RayProcess:
        """Start `argv` on a node of the cluster, relayed by a new actor; `OSError` if it cannot start there."""
        ray = _ray()
        relay = ray.remote(_Relay).options(num_cpus=RELAY_CPUS, num_gpus=self.num_gpus, max_concurrency=8,
                                           max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD")
        actor = relay.remote(list(argv), dict(env or {}), cwd)
        process = RayProcess(ray, actor)
        try:
            process.where = process.get(actor.where.remote(), timeout=300.0)
        except (WorkerLost, OSError) as exc:
            process.release()
            raise OSError(None, f"no relay actor started on the Ray cluster at {self.address} ({exc})") from None
        return process
