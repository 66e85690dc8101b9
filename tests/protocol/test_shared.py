"""One worker process serving both roles (`invar.transport.shared`, the training loop's shared layout), on the echo
worker: each role handshakes on its own channel under its own identity, every call is bound to the role that
answered it and recorded under that role's worker, the methods take turns, one role's close leaves the other
served, and a dead process fails both roles' calls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from invar.engines import start_worker
from invar.errors import ProtocolError
from invar.protocol import Role
from invar.records import RunStore
from invar.transport import WorkerClient, WorkerLost
from invar.transport.shared import SharedProcess


def start_both(shared: SharedProcess, store: RunStore | None = None,
               args: dict[Role, list[str]] | None = None) -> dict[Role, WorkerClient]:
    """Both roles started at once, as the training runner starts them (one thread each)."""
    clients: dict[Role, WorkerClient] = {}
    failures: list[BaseException] = []

    def start(role: Role) -> None:
        try:
            clients[role] = start_worker("echo", role, recorder=store, placement=shared,
                                         args=(args or {}).get(role))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(role,)) for role in Role]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        for client in clients.values():
            client.close()
        shared.close()
        raise failures[0]
    return clients


def test_each_role_has_its_own_channel_identity_and_records(tmp_path: Path) -> None:
    shared = SharedProcess()
    store = RunStore.create(tmp_path / "run")
    clients = start_both(shared, store)
    inference, learner = clients[Role.INFERENCE], clients[Role.LEARNER]
    try:
        # One process, two declared identities: the role's, as a split run's workers declare them.
        assert (inference.identity.role, learner.identity.role) == (Role.INFERENCE, Role.LEARNER)
        assert inference.identity.pid == learner.identity.pid == shared.process.pid
        a, b = inference.identity.to_wire(), learner.identity.to_wire()
        # Each role's server names its own start (its instance), as two processes' do.
        assert {k: v for k, v in a.items() if k not in ("role", "instance")} == \
            {k: v for k, v in b.items() if k not in ("role", "instance")}
        assert inference.worker_key != learner.worker_key
        assert inference.call("echo", {"who": "inference"}) == {"who": "inference"}
        assert learner.call("echo", {"who": "learner"}) == {"who": "learner"}
        # Each channel numbers its own calls, as a worker of its own would.
        assert inference.submit("echo", {}).answer().call.call_id == learner.submit("echo", {}).answer().call.call_id
    finally:
        learner.close()
        inference.close()
        shared.close()
    assert shared.process.returncode == 0
    records = store.calls()
    assert {r.worker for r in records} == {inference.worker_key, learner.worker_key}
    for r in records:  # every call answered, by the identity of the channel it was sent on
        assert r.report is not None
        assert r.report.report.identity_digest == r.worker
        assert r.identity.role == (Role.INFERENCE if r.worker == inference.worker_key else Role.LEARNER)
    assert store.verify().head
    store.close()


def test_the_roles_take_turns_and_one_close_leaves_the_other_served() -> None:
    shared = SharedProcess()
    clients = start_both(shared)
    inference, learner = clients[Role.INFERENCE], clients[Role.LEARNER]
    try:
        started = time.perf_counter()
        slow = inference.submit("sleep", {"seconds": 0.4})
        time.sleep(0.05)
        assert learner.call("echo", {"x": 1}) == {"x": 1}
        waited = time.perf_counter() - started
        assert slow.result() == {"slept": 0.4}
        print(f"measured: the learner's echo answered after {waited:.3f} s, behind the inference sleep of 0.4 s")
        assert waited >= 0.35  # one method at a time: the learner's call waited for the inference one
        started = time.perf_counter()
        assert learner.close() == 0
        closed = time.perf_counter() - started
        assert shared.process.poll() is None  # the inference role is still served
        assert inference.call("echo", {"still": True}) == {"still": True}
        assert closed < 2.0, closed
    finally:
        inference.close()
        shared.close()
    assert shared.process.returncode == 0


def test_a_dead_process_fails_both_roles() -> None:
    shared = SharedProcess()
    clients = start_both(shared)
    inference, learner = clients[Role.INFERENCE], clients[Role.LEARNER]
    try:
        pending = learner.submit("sleep", {"seconds": 30})
        time.sleep(0.2)
        os.kill(shared.process.pid, signal.SIGKILL)
        with pytest.raises(WorkerLost, match="echo-learner: worker exited"):
            pending.result()
        with pytest.raises(WorkerLost):
            inference.call("echo", {})
    finally:
        learner.close()
        inference.close()
        shared.close()


def test_a_role_never_started_still_lets_the_process_exit() -> None:
    shared = SharedProcess()
    inference = start_worker("echo", Role.INFERENCE, placement=shared)
    assert inference.close() == 0
    shared.close(timeout=10)
    assert shared.process.returncode == 0


# A worker whose never-started role writes its handshake late: only once the core has ended that role's calls.
_LATE_HANDSHAKE = """
import os, sys, time
calls, reports = map(int, sys.argv[sys.argv.index("--learner-channel") + 1].split(","))
while os.read(calls, 1 << 16):
    pass
time.sleep(0.2)
try:
    os.write(reports, b"handshake")
except BrokenPipeError:
    sys.exit(1)
"""


def test_a_role_never_started_may_write_its_handshake_after_the_close_began() -> None:
    # Under load, the server of a role no client started can reach its handshake only after the core has ended that
    # role; the process must still exit 0, or a clean close reads as a failed worker.
    shared = SharedProcess()
    inference = shared.spawn([sys.executable, "-c", _LATE_HANDSHAKE, "--role", "inference"], None, None)
    assert inference.stdin is not None
    inference.stdin.close()
    shared.close(timeout=30)
    assert shared.process.returncode == 0


def test_roles_with_other_command_lines_are_refused() -> None:
    with pytest.raises(ProtocolError, match="must start with the same command line and environment"):
        start_both(SharedProcess(), args={Role.INFERENCE: [], Role.LEARNER: ["--learner-channel", "7,8"]})


def test_only_an_inference_worker_serves_the_learner_as_well() -> None:
    out = subprocess.run([sys.executable, "-m", "invar.workers.echo", "--role", "learner", "--learner-channel",
                          "5,6"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == ("invar.workers.echo: error: --learner-channel: only an inference worker "
                                           "serves the learner as well; pass --role inference")
