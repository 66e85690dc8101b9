"""A local Ray cluster for the `--ray` tests (loopback only), and what they share to drive and read it.

The cluster itself is the session fixture `cluster` (tests/runner/conftest.py): one per test session, so the
use run and train tests pay for its start once."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from invar.engines import ENGINES, worker_env
from invar.records import RunStore
from invar.transport import forkserver

# Ray on this machine's loopback only: without this Ray gives its nodes the machine's routable address.
LOOPBACK_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _processes() -> dict[int, tuple[bytes, int]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found[int(entry)] = (cmd, ppid)
    return found


def _stop_cluster(marks: list[bytes]) -> None:
    """Stop the processes of this cluster only (named by its temp dir or its address) and their children; `ray stop`
    would stop every Ray cluster on the machine."""
    procs = _processes()
    mine = {pid for pid, (cmd, _) in procs.items() if pid != os.getpid() and any(m in cmd for m in marks)}
    grown = True
    while grown:
        grown = False
        for pid, (_, ppid) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grown = True
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(2)


NODE_SERVERS = ("hf", "mlx")
"""The engines whose workers the cluster's node forks from a fork server of its own: the `--ray` tests place HF
(use run) and MLX (train) workers."""


def start_node_servers(folder: Path, engines: Sequence[str], extra: Mapping[str, str],
                       log: Path) -> list[subprocess.Popen[bytes]]:
    """Fork servers for a Ray node's workers (`invar.transport.ray_relay`: a relay asks the server its node's
    environment names), in the environment those workers get: a command's (`extra` on this process's), to which
    the server's `--ray-node` adds what Ray sets in each actor where the command does not (`ray_relay.ACTOR_ENV`),
    as docs/scale.md has a user start it. The node is then started with `forkserver.ENV` naming `folder`; a worker
    placed before a server has imported its engine starts fresh."""
    with open(log, "ab") as out:  # each server writes to its own copy of the descriptor
        return [forkserver.start(folder, ENGINES[engine], worker_env(extra, engine), out, ray_node=True)
                for engine in engines]


def wait_served(folder: Path, engines: Sequence[str], timeout: float = 300) -> None:
    """Until each engine's fork server under `folder` serves (its socket appears once its engine is imported), so
    that the tests' workers are forked, as they claim."""
    deadline = time.monotonic() + timeout
    while not all(forkserver.socket_path(folder, ENGINES[e]).exists() for e in engines):
        log = folder.with_name("forkserver.log")
        assert time.monotonic() < deadline, (f"the fork servers under {folder} did not serve within {timeout:g} s: "
                                             f"{log.read_text(errors='replace')[-1000:] if log.exists() else ''}")
        time.sleep(0.2)


def forked_pids(log: Path) -> set[int]:
    """The workers the fork servers writing to `log` forked."""
    return set(forkserver.forked(log.read_text(encoding="utf-8", errors="replace").splitlines()))


@contextlib.contextmanager
def local_cluster(temp: Path) -> Iterator[str]:
    """A Ray head on 127.0.0.1 with 2 CPUs, its files under `temp`, its workers forked from fork servers of its own
    (`start_node_servers`); yields its address, stops it after."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    folder = temp / "forkserver"
    env = {**os.environ, **LOOPBACK_ENV, forkserver.ENV: str(folder)}
    ray_cli = Path(sys.executable).with_name("ray")
    # No log monitor: Invar's driver reads no worker output through Ray (`log_to_driver=False`; a relay moves its
    # worker's stderr itself), and the monitor polls the node's log files for as long as the session lasts.
    cmd = [str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
           "--include-dashboard=false", "--include-log-monitor=false", "--disable-usage-stats", "--temp-dir",
           str(temp), "--ray-client-server-port", str(free_port())]
    try:
        start_node_servers(folder, NODE_SERVERS, LOOPBACK_ENV, temp / "forkserver.log")
        started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, f"ray start failed:\n{started.stderr[-3000:]}"
        wait_served(folder, NODE_SERVERS)
        yield address
    finally:
        _stop_cluster([str(temp).encode(), f"127.0.0.1:{port}".encode()])


def ray_invar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **LOOPBACK_ENV})


def placements(run: Path) -> list[dict[str, Any]]:
    """Where each worker of a run ran (its meta `placement <worker>` entries)."""
    with RunStore.open(run) as store:
        return [v for k, v in store.meta().items() if k.startswith("placement ")]
