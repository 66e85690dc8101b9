"""A Ray cluster of several nodes on one machine, each node in its own network namespace with its own address.

Each node is a network namespace `invar-<tag>-<node>` holding one end of a veth pair (`eth0`, 10.251.0.N/24); the
other ends are ports of a bridge in a namespace of its own (`invar-<tag>-sw`), so the nodes reach one another only
through that bridge and nothing outside it: no address of the machine's own network is used, and the root
namespace is not touched. Every node runs Ray's own `ray start` (the head with `--num-cpus 0`, as Ray advises for a
head that drives jobs, so no worker is placed on it); the `invar` commands run inside the head's namespace, as a
user runs them on the head machine. Each worker node also runs a fork server of the HF worker, which its `ray start`
environment names, so its relays fork their workers (`invar.transport.ray_relay`) instead of starting each afresh.
Faults are real: a node is killed with every process in its namespace, and a partition takes the node's port on the
bridge down.

The cluster is the session fixture `netns_cluster` (tests/cluster/conftest.py); everything it made is removed in its
finalizer, even when a test fails. Namespaces need Linux and root (CAP_NET_ADMIN, as CI and these machines have).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from invar.engines import ENGINES, worker_env
from invar.records import RunStore
from invar.transport import forkserver

SUBNET = "10.251.0"
PORT = 6379  # each namespace has its own ports: every head may use Ray's default
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # A lost node is declared dead after 3 missed health checks 1 s apart (Ray's defaults take about 15 s).
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "1000",
}
OBJECT_STORE_BYTES = 100_000_000  # Ray's floor is 75 MB; the relays move small frames


class ClusterError(RuntimeError):
    """The cluster could not be made or changed: the message names the step and what the system said."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise ClusterError(f"'ip {' '.join(args)}' failed: {out.stderr.strip() or out.returncode}")
    return out


@dataclass
class Node:
    name: str
    ip: str
    port: str
    """The node's veth end on the bridge (in the switch namespace): down is a partition."""


@dataclass
class NetnsCluster:
    tag: str
    temp: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    made: list[str] = field(default_factory=list)
    """The namespaces made so far, removed at the end."""
    servers: dict[str, list[int]] = field(default_factory=dict)
    """Each worker node's fork servers (pids), started with its Ray: a relay there forks its worker from them."""

    @property
    def head(self) -> Node:
        return self.nodes["head"]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{PORT}"

    @property
    def workers(self) -> list[Node]:
        return [n for k, n in self.nodes.items() if k != "head"]

    def ns(self, node: str) -> str:
        return f"invar-{self.tag}-{node}"

    # -- the network -------------------------------------------------------------------------------------------

    def make_switch(self) -> None:
        sw = self.ns("sw")
        _ip("netns", "add", sw)
        self.made.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")

    def add_node(self, name: str) -> Node:
        """A namespace with its own address on the bridge (no Ray yet)."""
        index = len(self.nodes) + 1
        ns, port = self.ns(name), f"iv{self.tag}p{index}"
        _ip("netns", "add", ns)
        self.made.append(ns)
        # The veth pair is made in the root namespace and both ends moved out at once (names there are global).
        _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", port, "netns", self.ns("sw"))
        _ip("-n", self.ns("sw"), "link", "set", port, "master", "br0", "up")
        node = Node(name, f"{SUBNET}.{index}", port)
        _ip("-n", ns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.nodes[name] = node
        return node

    def cut(self, name: str) -> None:
        """A partition: the node's port on the bridge goes down; its processes keep running."""
        _ip("-n", self.ns("sw"), "link", "set", self.nodes[name].port, "down")

    def restore(self, name: str) -> None:
        _ip("-n", self.ns("sw"), "link", "set", self.nodes[name].port, "up")

    # -- processes -----------------------------------------------------------------------------------------------

    def own_env(self) -> dict[str, str]:
        # A token another Ray left in ~/.ray/auth_token would be this cluster's head's and not its nodes' (seen: the
        # nodes then fail to join): every process of this cluster uses token auth with the cluster's own token.
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **RAY_ENV, **self.own_env(), **(extra or {})}

    def argv(self, node: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def pids(self, node: str) -> list[int]:
        """Every process in the node's namespace."""
        out = _ip("netns", "pids", self.ns(node), check=False)
        return [int(p) for p in out.stdout.split()]

    def kill_node(self, node: str) -> list[int]:
        """The node is lost: SIGKILL to its raylet and every other process in its namespace, until none is left."""
        killed: list[int] = []
        deadline = time.monotonic() + 30
        while (pids := self.pids(node)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.2)
        if self.pids(node):
            raise ClusterError(f"the processes of node {node} outlived SIGKILL: {self.pids(node)}")
        return killed

    def start_servers(self, node: str) -> str:
        """Fork servers of the worker modules the cluster's tests place, in the node's namespace and in the
        environment its relays' workers get (tests/runner/ray_cluster.py, `start_node_servers`); the folder its Ray
        is to name. A server still importing its engine when a worker is placed leaves that worker to start fresh."""
        folder = self.temp / f"forkserver-{node}"
        folder.mkdir(parents=True, exist_ok=True)
        env = worker_env({**RAY_ENV, **self.own_env()}, "hf")
        with open(self.temp / f"forkserver-{node}.log", "ab") as log:
            proc = subprocess.Popen(self.argv(node, *forkserver.command(folder, ENGINES["hf"], ray_node=True)),
                                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self.servers[node] = [proc.pid]  # `ip netns exec` runs the server in its own process
        return str(folder)

    def wait_served(self, timeout: float = 300) -> None:
        """Until every worker node's fork servers serve (a socket appears once the engine is imported)."""
        deadline = time.monotonic() + timeout
        sockets = [forkserver.socket_path(self.temp / f"forkserver-{n.name}", ENGINES["hf"]) for n in self.workers]
        while not all(s.exists() for s in sockets):
            if time.monotonic() > deadline:
                logs = " | ".join(p.read_text(errors="replace")[-500:] for p in self.temp.glob("forkserver-*.log"))
                raise ClusterError(f"the nodes' fork servers did not serve within {timeout:g} s: {logs}")
            time.sleep(0.2)

    def forked(self) -> set[int]:
        """The workers the worker nodes' fork servers forked (`forkserver: forked PID for TEST` in their logs)."""
        return {pid for log in self.temp.glob("forkserver-*.log")
                for pid in forkserver.forked(log.read_text(encoding="utf-8", errors="replace").splitlines())}

    def start_ray(self, node: str) -> None:
        n = self.nodes[node]
        ray = str(Path(sys.executable).with_name("ray"))
        # No log monitor (as tests/runner/ray_cluster.py): Invar's driver reads no worker output through Ray.
        common = ["--node-ip-address", n.ip, "--disable-usage-stats", "--object-store-memory", str(OBJECT_STORE_BYTES),
                  "--include-log-monitor=false"]
        if node == "head":
            cmd = [ray, "start", "--head", "--port", str(PORT), "--num-cpus", "0", "--include-dashboard=false",
                   "--temp-dir", str(self.temp), *common]
        else:
            cmd = [ray, "start", "--address", self.address, "--num-cpus", "1", *common]
        extra = {forkserver.ENV: self.start_servers(node)} if node != "head" else {}
        out = subprocess.run(self.argv(node, *cmd), env=self.env(extra), capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            raise ClusterError(f"ray start on node {node} failed:\n{out.stderr[-3000:]}")

    def alive(self) -> dict[str, str]:
        """The nodes the cluster's head counts alive: node id → address."""
        script = ("import json, logging, ray\n"
                  f"ray.init(address={self.address!r}, log_to_driver=False, logging_level=logging.ERROR)\n"
                  "print(json.dumps({n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}))\n")
        out = subprocess.run(self.argv("head", sys.executable, "-c", script), env=self.env(), capture_output=True,
                             text=True, timeout=120)
        if out.returncode != 0:
            raise ClusterError(f"cannot list the cluster's nodes:\n{out.stderr[-2000:]}")
        found: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
        return found

    def wait_alive(self, ips: set[str], timeout: float = 120) -> dict[str, str]:
        """Until the head counts exactly the nodes at `ips` alive (a lost node declared dead, a new one joined)."""
        deadline = time.monotonic() + timeout
        while True:
            alive = self.alive()
            if set(alive.values()) == ips and len(alive) == len(ips):
                return alive
            if time.monotonic() > deadline:
                raise ClusterError(f"the cluster's nodes are {sorted(alive.values())}, not {sorted(ips)}")
            time.sleep(1)

    def revive(self, node: str) -> None:
        """The node back under the same address: what is left of it is killed, its link up, Ray started again."""
        self.kill_node(node)
        self.restore(node)
        self.start_ray(node)

    def invar(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """An `invar` command on the head, as a user runs it there."""
        return subprocess.run(self.argv("head", sys.executable, "-m", "invar.cli", *args), env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def popen_invar(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv("head", sys.executable, "-m", "invar.cli", *args), env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def teardown(self) -> None:
        for ns in reversed(self.made):
            for pid in [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made.clear()
        shutil.rmtree(self.temp, ignore_errors=True)


@contextlib.contextmanager
def netns_cluster(temp: Path, workers: int = 2) -> Iterator[NetnsCluster]:
    """A head and `workers` worker nodes, each in its own namespace; removed after, even on failure."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise ClusterError("a multi-node cluster needs network namespaces: run as root (CAP_NET_ADMIN) with "
                           "iproute2's 'ip' installed")
    cluster = NetnsCluster(tag=str(os.getpid() % 100000), temp=temp)
    try:
        cluster.make_switch()
        for name in ["head", *(f"w{i}" for i in range(1, workers + 1))]:
            cluster.add_node(name)
        for name in cluster.nodes:
            cluster.start_ray(name)
        cluster.wait_alive({n.ip for n in cluster.workers} | {cluster.head.ip})
        cluster.wait_served()
        yield cluster
    finally:
        cluster.teardown()


def call_nodes(run: Path) -> list[tuple[str, str, str, bool]]:
    """Each call of a run with the node whose worker it was sent to: (method, node id, node address, answered),
    read from the records alone (a call names its worker's identity; the meta's placement names that worker's
    node)."""
    with RunStore.open(run) as store:
        where = {v["worker"]: v for k, v in store.meta().items() if k.startswith("placement ")}
        return [(c.call.method, where[c.worker]["node_id"], where[c.worker]["node_ip"], c.report is not None)
                for c in store.calls()]


def placements(run: Path) -> list[dict[str, Any]]:
    with RunStore.open(run) as store:
        return [v for k, v in store.meta().items() if k.startswith("placement ")]
