"""Workers forked from a process that has already imported their engine: a start without the engine's imports.

    python -P -m invar.transport.forkserver FOLDER invar.workers.hf_worker     (one server per worker module)
    INVAR_FORKSERVER=FOLDER invar ...
    python -P -m invar.transport.forkserver --ray-node FOLDER invar.workers.hf_worker     (on a Ray node)

Most of an HF or MLX worker's start is importing torch and transformers, or mlx and mlx-lm: about 5 s of CPU of the
6–7 s to its handshake on this project's machines; a vLLM worker's import of vllm takes longer still. A fork server
imports a worker module's engine libraries once (the third-party modules the worker's file imports at module level,
read from its source, and its `STARTUP_IMPORTS`: nothing of the worker or the core is run), then forks one child per
worker. The child becomes the worker the core asked for: its own session, the core's pipes as its stdin, stdout and
stderr, the core's folder, environment and command line, and the worker module run as `__main__` from the files on
disk. Every `invar` module is imported afresh in the child, so the code that answers, and the worker digest it
reports, are those of the files at the time of the call, as for a fresh process. The core binds and records the
worker exactly as it does a local subprocess; nothing in the records says how it started, apart from the worker's
pid (its parent is the server).

Decision: **serve only what a fresh process would run the same way, and start a fresh process otherwise.** A
preloaded library has read its environment at import (OpenMP's thread count, the hub's offline flags, …), so a
request is refused unless its environment equals the server's on every name except those of `RUNTIME_NAMES` (read
by the core's own code, which the child imports afresh) and `PYTHONPATH`, which may differ only where every
preloaded package is still found in the file the server loaded (and the names below that no loaded library reads,
and `LD_LIBRARY_PATH` wherever it names the same existing folders). The interpreter, the `-P -m` form and the module
must be the server's too. A refused request, a server that is not there or not answering, or any error talking to
it: the core starts the worker as a local subprocess (`spawn_local`), as without a server.

Decision: **the server process is single-threaded** (a selector over its socket, its connections and a SIGCHLD
wake-up), since a fork copies only the thread that calls it. The engines are imported, never run, before a fork, so
no thread pool is started that a child would inherit half of (the only other threads are the BLAS libraries' idle
servers that numpy, scipy and OpenCV load, which OpenBLAS restarts after a fork, and the background thread of the
jemalloc that pyarrow bundles, whose fork handlers hold its locks across the fork). Each worker's connection stays
open while it runs: the server sends the exit status when it reaps the child, kills the child's session when asked
(`kill`) and when the connection drops (the core that started it is gone, as a local worker dies with its parent). A
server that stops kills its children too: each watches its parent (`invar.protocol.server._die_with_parent`).

A vLLM worker builds its engine, and with it the engine's own processes and threads, in the child. A Ray placement's
relay asks the server its node's environment names (`invar.transport.ray_relay`), under the same rules. Not for: the
shared training layout (its worker takes a second channel of pipes); a worker whose process-wide limits or CPU
affinity must be the command's (a forked child has the server's).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from importlib.machinery import BuiltinImporter, FrozenImporter, PathFinder
from pathlib import Path
from typing import IO, Any

from invar.transport.client import _F_SETPIPE_SZ

ENV = "INVAR_FORKSERVER"
"""The folder of the fork servers' sockets, one per worker module (`socket_path`); unset: every worker is a fresh
process."""

RUNTIME_NAMES = ("INVAR_", "PYTEST_")
"""Environment names, by prefix, that may differ between the server and a worker it forks: the core's own settings
and a test runner's, read only by code the child imports afresh. Any other difference refuses the request."""

SHELL_NAMES = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "COLUMNS", "LINES"})
"""Names a shell sets for each command it runs (the last program, its folder) and the terminal's size that readline
sets in a process's environment (pytest loads it, so every command a test starts has them): no engine's import reads
them, and the child runs with the request's own."""

CALL_TIME_NAMES = frozenset({"TRANSFORMERS_NO_ADVISORY_WARNINGS", "PYTHONBREAKPOINT", "MYPY_CONFIG_FILE_DIR"})
"""Names read only when used, never at an import: transformers at each advisory warning (mlx-lm's import sets it,
so a command that imported mlx-lm carries it), Python at each `breakpoint()`, and mypy's own (a command that ran
mypy in its process carries it); the child runs with the request's own."""

OTHER_LIBRARIES = {"VLLM_": "vllm", "MLX_": "mlx", "RAY_": "ray", "HF_DATASETS_": "datasets", "INSPECT_": "inspect_ai"}
"""Environment prefixes of libraries that read their own names: a difference there cannot matter to a server that
has not imported the library (an HF server and `VLLM_CPU_KVCACHE_SPACE`); the child runs with the request's own.
`HF_DATASETS_` names are read by datasets and by evaluate, which imports datasets; `INSPECT_` names by inspect_ai
alone (a command that runs an inspect evaluation offline passes `HF_DATASETS_OFFLINE` and `INSPECT_DISPLAY`)."""

SEARCH_PATH_NAMES = frozenset({"LD_LIBRARY_PATH"})
"""Search paths compared by the folders they name that exist: an entry that is no folder finds nothing, so the
dynamic loader searches alike with it and without it. OpenCV's import prepends a folder of its own that exists
only in some installs (`cv2/../../lib64`), so a command that imported it, and a server that did, carry one."""

KMP_PREFIX = "KMP_"
"""Names read by Intel's and LLVM's OpenMP runtimes (libiomp5, libomp) as they load, and by nothing else. A process
that imported scikit-learn or joblib carries two of them (both set KMP_INIT_AT_FORK, scikit-learn also
KMP_DUPLICATE_LIB_OK, at import). A runtime loaded in the server read the server's values; one a child loads later
reads the request's, as a fresh process would. So a difference is refused only where such a runtime is loaded in the
server (`_kmp_runtime_loaded`): torch and the engines here load GNU's libgomp, which reads none of them."""

STARTUP_IMPORTS: dict[str, tuple[str, ...]] = {
    "invar.workers.vllm_worker": ("vllm", "vllm.entrypoints.llm", "vllm.lora.request")}
"""Engines a worker imports inside its start rather than at module level, on every path that reaches its handshake:
the server preloads them too. vLLM's worker imports `vllm` in `main`, after checking its arguments and setting
`VLLM_ENABLE_V1_MULTIPROCESSING` for a patch (vLLM reads that name when it builds an engine, not at import), then
the engine's entry point `vllm.entrypoints.llm` and its LoRA requests, before it applies any patch. `import vllm`
alone loads little (its names resolve lazily): the entry point is about 5 of a forked worker's 11 CPU-s from the
fork to its first generate on the tiny model (docs/testing.md, "Forked worker starts")."""

FORKED_FOR = "PYTEST_CURRENT_TEST"
"""The name in a request's environment that says which test asked for the worker (pytest sets it in its process, and
a command a test runs inherits it): the server's log line for each fork names it (`forked PID for TEST`)."""

_MESSAGE_LIMIT = 1 << 20
_REQUEST_TIMEOUT_S = 10.0


_FORKED_LINE = "forkserver: forked "
"""How the server's log (its stderr) begins the line of each worker it forked: `forkserver: forked PID[ for TEST]`."""


def forked(log_lines: Iterable[str]) -> dict[int, str]:
    """The workers a server's log says it forked: pid → the test that asked (`FORKED_FOR`, without the phase pytest
    appends, such as "(call)"), "" where none was named."""
    found = {}
    for line in log_lines:
        if line.startswith(_FORKED_LINE):
            pid, _, test = line.removeprefix(_FORKED_LINE).partition(" for ")
            if pid.isdigit():
                found[int(pid)] = test.split(" ")[0]
    return found


def socket_path(folder: str | os.PathLike[str], module: str) -> Path:
    return Path(folder) / f"{module}.sock"


def preloads(module: str, path: Sequence[str]) -> list[str]:
    """The modules a fork server of worker `module` imports: each one the worker's file imports at module level,
    outside the `invar` package and `__future__`, in the file's order, then its `STARTUP_IMPORTS`."""
    from invar.worker_code import _locate  # the worker's file on `path`, as its code digest finds it

    found = _locate(module, path)
    if found is None:
        raise SystemExit(f"forkserver: no module {module} on the search path")
    tree = ast.parse(found[0].read_bytes(), filename=str(found[0]))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    names += STARTUP_IMPORTS.get(module, ())
    return [n for n in dict.fromkeys(names) if n.partition(".")[0] not in ("invar", "__future__")]


# -- the core's side -----------------------------------------------------------------------------------------------


class ForkedWorker:
    """A worker the server forked, as the client drives it (`invar.transport.client.WorkerProcess`): its pipes, and
    its life through the connection that started it."""

    def __init__(self, conn: socket.socket, pid: int, argv: Sequence[str],
                 stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self._conn, self.pid, self.args = conn, pid, list(argv)
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.returncode: int | None = None
        self._pending = b""
        self._lock = threading.Lock()  # the client polls from its reader threads as well as its own

    def _read_status(self, timeout: float | None) -> None:
        with self._lock:
            self._read_status_locked(timeout)

    def _read_status_locked(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                data = self._conn.recv(64)
            except (TimeoutError, BlockingIOError):
                return
            except OSError:
                data = b""
            if not data:  # the server is gone without a status: the child watches it and ends too
                self.returncode = -signal.SIGKILL
                self._conn.close()
                return
            self._pending += data
        line, _, _ = self._pending.partition(b"\n")
        self.returncode = int(line)
        self._conn.close()

    def poll(self) -> int | None:
        self._read_status(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_status(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                self._conn.sendall(b"k")


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(sock, [len(data).to_bytes(4, "big") + data], list(fds))


def _receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_LIMIT + 4, max_fds)
    try:
        size = int.from_bytes(data[:4], "big")
        while len(data) < size + 4:
            more = sock.recv(size + 4 - len(data))
            if not more:
                raise OSError("the connection closed inside a message")
            data += more
        message = json.loads(data[4:size + 4])
        if not isinstance(message, dict):
            raise OSError("a message is not an object")
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def spawn(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> ForkedWorker | None:
    """The worker forked by the server `INVAR_FORKSERVER` names for its module, or None where there is none, it
    refuses (it says why in its log) or cannot be reached: the caller then starts a local subprocess."""
    folder = os.environ.get(ENV)
    if not folder or len(argv) < 4 or argv[1:3] != ["-P", "-m"]:
        return None
    path = socket_path(folder, argv[3])
    if not path.exists():
        return None
    pipes = [os.pipe() for _ in range(3)]  # (read, write) each: the child's stdin reads [0][0], writes [1][1], [2][1]
    theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
    ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(_REQUEST_TIMEOUT_S)
        conn.connect(str(path))
        _send(conn, {"argv": list(argv), "env": dict(os.environ if env is None else env),
                     "cwd": cwd or os.getcwd()}, theirs)
        answer, _ = _receive(conn)
    except OSError:
        answer = {}
    for fd in theirs:
        os.close(fd)
    pid = answer.get("pid")
    if not isinstance(pid, int):
        conn.close()
        for fd in ours:
            os.close(fd)
        return None
    conn.settimeout(None)
    for fd in ours[:2]:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
    return ForkedWorker(conn, pid, argv, os.fdopen(ours[0], "wb", buffering=0), os.fdopen(ours[1], "rb", buffering=0),
                        os.fdopen(ours[2], "rb", buffering=0))


def start(folder: str | os.PathLike[str], module: str, env: Mapping[str, str],
          log: IO[bytes] | int | None = None, ray_node: bool = False) -> subprocess.Popen[bytes]:
    """Start a fork server of worker `module` under `folder`, in `env` as `main` completes it (`served_env`; with
    `ray_node`, for a Ray node's relays). It serves once it has imported the engine: its socket appears then, and
    until then workers start as local subprocesses."""
    return subprocess.Popen(command(folder, module, ray_node), env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=log, start_new_session=True)


def command(folder: str | os.PathLike[str], module: str, ray_node: bool = False) -> list[str]:
    """The command line of a fork server of worker `module` under `folder` (`main`'s)."""
    return [sys.executable, "-P", "-m", "invar.transport.forkserver", *(["--ray-node"] * ray_node), str(folder),
            module]


# -- the server ----------------------------------------------------------------------------------------------------


def _refusal(request: Mapping[str, Any], module: str, served: Sequence[str]) -> str | None:
    """Why the server must not fork this request (None: it may)."""
    argv, env = request.get("argv"), request.get("env")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or len(argv) < 4:
        return "no command line"
    if not isinstance(env, dict) or not isinstance(request.get("cwd"), str):
        return "no environment or folder"
    if argv[0] != sys.executable or argv[1:3] != ["-P", "-m"] or argv[3] != module:
        return f"not this server's command line ({' '.join(argv[:4])})"
    names = set(env) | set(_STARTED_ENV)
    unloaded = tuple(prefix for prefix, library in OTHER_LIBRARIES.items() if library not in sys.modules)
    unloaded += () if _KMP_RUNTIME[0] else (KMP_PREFIX,)
    differ = sorted(n for n in names if env.get(n) != _STARTED_ENV.get(n) and n != "PYTHONPATH"
                    and not (n in SEARCH_PATH_NAMES and _folders(env.get(n)) == _folders(_STARTED_ENV.get(n)))
                    and n not in SHELL_NAMES | CALL_TIME_NAMES and not n.startswith(RUNTIME_NAMES + unloaded)
                    # what the engine's own import sets it to: a fresh worker's import would leave it so
                    and not (n in _SET_BY_IMPORTS and env.get(n) == _SET_BY_IMPORTS[n]))
    if differ:
        return "its environment differs on " + ", ".join(differ)
    if env.get("PYTHONPATH") != _STARTED_ENV.get("PYTHONPATH"):
        child_path = _search_path(env.get("PYTHONPATH"))
        for name in served:
            top = name.partition(".")[0]
            if BuiltinImporter.find_spec(top) is not None or FrozenImporter.find_spec(top) is not None:
                continue  # found before any search path is
            spec = PathFinder.find_spec(top, child_path)
            loaded = sys.modules.get(top)
            if spec is None or loaded is None or spec.origin != getattr(loaded, "__file__", None):
                return f"its PYTHONPATH finds another {top}"
    return None


def _folders(search_path: str | None) -> list[str]:
    """The entries of a search path the dynamic loader may find something in, in order: all but the absolute ones
    that are no folder (an empty or relative entry names a folder of the worker's, compared as written)."""
    return [p for p in (search_path or "").split(os.pathsep) if not os.path.isabs(p) or os.path.isdir(p)] \
        if search_path else []


_STARTED_ENV: dict[str, str] = {}
"""The server's environment as it started, before the preloads: what a request's is compared with."""

_SET_BY_IMPORTS: dict[str, str | None] = {}
"""What the preloads changed in the environment (None: removed): a fresh worker's imports would change the same."""

_BASE_PATH: list[str] = []
"""The server's search path without its PYTHONPATH entries: the interpreter's own, as a worker's would be."""

_KMP_RUNTIME = [True]
"""Whether an OpenMP runtime that reads `KMP_PREFIX` names is loaded in the server, found after the preloads (True
until then, and where it cannot be told: such names must then be equal)."""


def _kmp_runtime_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether Intel's or LLVM's OpenMP runtime is mapped into this process (True where the maps cannot be read)."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return any(os.path.basename(line.rpartition(" ")[2]).startswith(("libiomp", "libomp.", "libomp-"))
               for line in text.splitlines())


def _search_path(pythonpath: str | None) -> list[str]:
    return [p for p in (pythonpath or "").split(os.pathsep) if p] + _BASE_PATH


def _become_worker(request: Mapping[str, Any], fds: Sequence[int], server_fds: Sequence[int]) -> None:
    """In the forked child: become the worker the request names, run it, and exit with its status."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in server_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        for name, value in _SET_BY_IMPORTS.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sys.path[:] = _search_path(env.get("PYTHONPATH"))
        # The core's modules come from the files as they are now, as in a fresh process.
        for name in [n for n in sys.modules if n == "invar" or n.startswith("invar.")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        argv = request["argv"]
        sys.argv = ["-m", *argv[4:]]
        try:
            runpy.run_module(argv[3], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except BaseException:  # the worker's own failure, printed as Python would
            traceback.print_exc()
            code = 1
        import atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def serve(folder: Path, module: str) -> int:
    """Import `module`'s engine, then fork a worker for each request on its socket until SIGTERM; 0 when stopped."""
    _BASE_PATH[:] = sys.path[len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):]
    _STARTED_ENV.update(os.environ)
    served = preloads(module, sys.path)
    for name in served:
        importlib.import_module(name)
    _SET_BY_IMPORTS.update({n: os.environ.get(n) for n in set(os.environ) | set(_STARTED_ENV)
                            if os.environ.get(n) != _STARTED_ENV.get(n)})
    _KMP_RUNTIME[0] = _kmp_runtime_loaded()
    if _SET_BY_IMPORTS:
        print(f"forkserver: the engine's imports set {', '.join(sorted(_SET_BY_IMPORTS))}; each worker gets the same",
              file=sys.stderr, flush=True)
    # Nothing of the core stays loaded to be forked: each child imports it from the files.
    for name in [n for n in sys.modules if (n == "invar" or n.startswith("invar.")) and n != __name__]:
        del sys.modules[name]

    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    folder.mkdir(parents=True, exist_ok=True)
    path = socket_path(folder, module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    listener.bind(str(tmp))
    listener.listen(64)
    os.replace(tmp, path)  # the socket appears only once it answers
    sel.register(listener, selectors.EVENT_READ, "listen")
    print(f"forkserver {os.getpid()}: serving {module} ({len(served)} modules preloaded)", file=sys.stderr,
          flush=True)
    # child pid → its connection (None once the core is gone); each connection is registered with its child's pid
    children: dict[int, socket.socket | None] = {}
    forked = refused = 0

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = children.pop(pid, None)
            if conn is not None:
                sel.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()

    while not stopping or children:
        if stopping and listener.fileno() >= 0:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            sel.unregister(listener)
            listener.close()
            for pid in children:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        for key, _ in sel.select(timeout=1.0):
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                reap()
            elif key.data == "listen":
                conn, _ = listener.accept()
                conn.settimeout(_REQUEST_TIMEOUT_S)
                try:
                    request, fds = _receive(conn, 3)
                except OSError:
                    conn.close()
                    continue
                why = _refusal(request, module, served) if len(fds) == 3 else "it sent no pipes"
                if why is not None:
                    refused += 1
                    print(f"forkserver: refused a {module} worker: {why}", file=sys.stderr, flush=True)
                    with contextlib.suppress(OSError):
                        _send(conn, {"refused": why})
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                pid = os.fork()
                if pid == 0:
                    _become_worker(request, fds, [wake_r, wake_w, listener.fileno(), conn.fileno(), sel.fileno(),
                                                  *(c.fileno() for c in children.values() if c is not None)])
                for fd in fds:
                    os.close(fd)
                forked += 1
                conn.settimeout(None)
                try:
                    _send(conn, {"pid": pid})
                except OSError:  # the core is gone already
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                    conn.close()
                    children[pid] = None
                    continue
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
                # The test that asked, where a test runner names it: a suite counts its worker starts per test file.
                asker = request["env"].get(FORKED_FOR)
                print(f"{_FORKED_LINE}{pid}" + (f" for {asker}" if asker else ""), file=sys.stderr, flush=True)
            else:  # a worker's connection: `k` asks for the kill; its end means the core that started it is gone
                peer, owner = key.fileobj, key.data
                assert isinstance(peer, socket.socket)
                try:
                    data = peer.recv(64)
                except OSError:
                    data = b""
                if b"k" in data or not data:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(owner, signal.SIGKILL)
                if not data:
                    sel.unregister(peer)
                    children[owner] = None
                    peer.close()
    print(f"forkserver {os.getpid()}: stopped; {forked} workers forked, {refused} refused", file=sys.stderr,
          flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m invar.transport.forkserver",
                                     description="Fork workers of one module from a process that imported its engine.")
    parser.add_argument("folder", type=Path, help="where its socket goes (INVAR_FORKSERVER names the folder)")
    parser.add_argument("module", help="the worker module it serves, e.g. invar.workers.hf_worker")
    parser.add_argument("--ray-node", action="store_true",
                        help="serve the relays of a Ray node started from this shell: add what Ray sets in each "
                             "actor's environment (invar.transport.ray_relay.ACTOR_ENV) where this one lacks it")
    args = parser.parse_args(argv)
    os.environ.update(served_env(os.environ, args.module, ray_node=args.ray_node))
    return serve(args.folder, args.module)


def served_env(env: Mapping[str, str], module: str, ray_node: bool = False) -> dict[str, str]:
    """The environment a server of `module` started in `env` serves in: the one a command started in `env` gives
    its worker (`invar.transport.environment.worker_defaults` where `env` lacks them; `PYTHONPATH` may differ under
    the refusal rules), and on a Ray node what Ray adds to each actor's where neither sets it. A server started in a
    shell without the workers' defaults would otherwise refuse every request, its environment differing on them."""
    from invar.transport.environment import worker_defaults
    from invar.transport.ray_relay import ACTOR_ENV

    served = dict(env)
    for defaults in (worker_defaults([module]), ACTOR_ENV if ray_node else {}):  # a command's own names come first
        for name, value in defaults.items():
            served.setdefault(name, value)
    return served


if __name__ == "__main__":
    sys.exit(main())
