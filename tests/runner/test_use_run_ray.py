"""`invar use run --ray`: workers placed as Ray actors on a local Ray cluster (started here, loopback only) give the
records' decision of local workers; a worker whose actor is killed mid-call is replaced and its call issued again,
nothing lost; an unreachable address and a worker that is not the package are one line, exit 2. The cluster is the
session's (`cluster`, tests/runner/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import LOOPBACK_ENV, forked_pids, free_port, placements, ray_invar
from support.use_runs import decision_figures as _decision_figures
from support.use_runs import outputs_by_call as _outputs_by_call
from test_use_run import _invar, write_declaration

from invar.records import RunStore

pytestmark = pytest.mark.engine

@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("use-run-ray")
    decl = write_declaration(folder, "ray-nf4", units=12)
    out = _invar("use", "prepare", str(decl))
    assert out.returncode == 0, out.stderr
    return folder / "ray-nf4.contract.json"


@pytest.fixture(scope="module")
def local(contract: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("local") / "run"
    out = _invar("use", "run", str(contract), "--run", str(run), "--json")
    assert out.returncode == 0, out.stderr
    return run


def test_ray_placed_workers_give_the_decision_of_local_ones(cluster: str, cluster_home: Path, contract: Path,
                                                           local: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = ray_invar("use", "run", str(contract), "--run", str(run), "--ray", cluster, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["calls_issued"] == doc["calls_total"]
    assert _decision_figures(run, contract) == _decision_figures(local, contract)
    assert _outputs_by_call(run, contract) == _outputs_by_call(local, contract)
    admitted = _invar("use", "admit", str(run), "--contract", str(contract), "--expect-head", doc["chain_head"])
    assert admitted.returncode in (0, 10, 11), admitted.stderr
    # Where each worker ran is kept, outside the identities: an actor per package on this cluster's one (loopback)
    # node. (Two workers a package on Ray, spread over nodes: tests/cluster/test_cluster_use_run.py.)
    placed = placements(run)
    assert len(placed) == 2
    assert {p["node_ip"] for p in placed} == {"127.0.0.1"}
    with RunStore.open(run) as store:
        assert {p["worker"] for p in placed} == set(store.workers())
        assert {c.worker for c in store.calls()} == set(store.workers())
    # The node's environment names its fork server (tests/runner/ray_cluster.py): each relay had it fork the worker.
    assert {p["worker_pid"] for p in placed} <= forked_pids(cluster_home / "forkserver.log")


def test_a_killed_actor_is_replaced_and_its_call_issued_again(cluster: str, contract: Path, local: Path,
                                                               tmp_path: Path) -> None:
    # The kill is aimed at a call seen unanswered on record, but the worker may answer it before SIGKILL lands (a
    # few milliseconds, more on a loaded machine): such an attempt still checks the run, then the scenario is run
    # again, until a kill lands on a call in flight.
    for attempt in range(3):
        if _kill_an_actor_mid_call(cluster, contract, local, tmp_path / f"run-{attempt}"):
            return
    pytest.fail("in 3 attempts, every killed actor had answered its call before the kill landed")


def _kill_an_actor_mid_call(cluster: str, contract: Path, local: Path, run: Path) -> bool:
    """One run with a relay actor killed while its worker holds a generate call; False when the call turned out to
    be answered before the kill (the run is checked all the same)."""
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run),
                             "--ray", cluster, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **LOOPBACK_ENV})
    killed: dict[str, Any] | None = None
    unanswered = None
    deadline = time.monotonic() + 300
    # Kill a relay actor's process while its worker holds a generate call, after at least one report is on record.
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        try:
            with RunStore.open(run) as store:
                calls = store.calls()
                placed = [v for k, v in store.meta().items() if k.startswith("placement ")]
        except Exception:  # the run may not exist yet, or be mid-write
            continue
        if not any(c.report is not None and c.call.method == "generate" for c in calls):
            continue
        for c in calls:
            if c.report is None and c.call.method == "generate":
                target = [p for p in placed if p["worker"] == c.worker]
                if target:
                    killed, unanswered = target[0], (c.worker, c.call_digest)
                    first_workers = {p["worker"] for p in placed}
                    os.kill(killed["actor_pid"], signal.SIGKILL)
                    break
    assert killed is not None, "no call was in flight to kill"
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert stdout.startswith("{"), (stdout[:2000], stderr[-2000:])
    doc = json.loads(stdout)
    assert _decision_figures(run, contract) == _decision_figures(local, contract)
    assert _outputs_by_call(run, contract) == _outputs_by_call(local, contract)
    admitted = _invar("use", "admit", str(run), "--contract", str(contract), "--expect-head", doc["chain_head"])
    assert admitted.returncode in (0, 10, 11), admitted.stderr
    with RunStore.open(run) as store:
        store.verify()
        calls = store.calls()
    # The killed attempt's call stays on record, unanswered; the same planned call was issued again and answered.
    lost = [c for c in calls if (c.worker, c.call_digest) == unanswered]
    assert len(lost) == 1
    if lost[0].report is not None:
        return False
    # (the other package's call has the same params: it is answered by the other package's first worker)
    again = [c for c in calls if c.call.method == "generate" and c.call.params == lost[0].call.params
             and c.report is not None and c.worker not in first_workers]
    assert len(again) == 1
    assert len(placements(run)) == 3  # the two first actors and the replacement
    # The killed actor's worker went with it.
    with pytest.raises(ProcessLookupError):
        os.kill(killed["worker_pid"], 0)
    return True


def test_an_unreachable_address_is_one_line_and_loses_nothing(contract: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    # A run stopped part-way (its CLI killed after the first report) ...
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        try:
            with RunStore.open(run) as store:
                if any(c.report is not None for c in store.calls()):
                    break
        except Exception:  # not there yet
            continue
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    with RunStore.open(run) as store:
        before = store.verify().head
    # ... then resumed on a Ray address nobody serves.
    started = time.monotonic()
    out = ray_invar("use", "run", str(contract), "--run", str(run), "--ray", f"127.0.0.1:{free_port()}")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "cannot reach a Ray cluster there" in out.stderr
    assert "ray start --head" in out.stderr
    assert time.monotonic() - started < 60
    with RunStore.open(run) as store:
        assert store.verify().head == before  # nothing recorded, nothing lost
    bad = ray_invar("use", "run", str(contract), "--run", str(run), "--ray", "nowhere")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "expected HOST:PORT" in bad.stderr
    # An address that accepts connections but is no Ray head: bounded (30 s in the commands; 3 s here), nothing of
    # Ray's own retry logging on stderr.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        script = ("import sys\nfrom invar.errors import InvarError\nfrom invar.transport.ray_relay import connect\n"
                  f"try:\n    connect('127.0.0.1:{listener.getsockname()[1]}', timeout=3.0)\n"
                  "except InvarError as exc:\n    print(exc)\n    sys.exit(2)\n")
        started = time.monotonic()
        silent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                                env={**os.environ, **LOOPBACK_ENV})
    assert silent.returncode == 2, silent.stderr
    assert "cannot reach a Ray cluster there (no Ray head answered within 3 s)" in silent.stdout
    assert silent.stderr == ""
    assert time.monotonic() - started < 60
    zero = ray_invar("use", "run", str(contract), "--run", str(run), "--ray", "127.0.0.1:1", "--workers", "0")
    assert zero.returncode == 2
    assert zero.stderr.count("\n") == 1
    assert "--workers 0: must be ≥ 1" in zero.stderr


def test_a_ray_placed_worker_that_is_not_the_package_is_refused(cluster: str, contract: Path,
                                                                 tmp_path: Path) -> None:
    # The module's declaration with the candidate's torch version changed (no second identity probe).
    text = contract.with_name("ray-nf4.toml").read_text(encoding="utf-8")
    head, cand = text.split("[candidate]")
    cand = re.sub(r'"torch" = "[^"]*"', '"torch" = "0.0.1"', cand)
    assert '"torch" = "0.0.1"' in cand
    decl = tmp_path / "foreign.toml"
    decl.write_text(head.replace('name = "ray-nf4"', 'name = "foreign"') + "[candidate]" + cand, encoding="utf-8")
    assert _invar("use", "prepare", str(decl)).returncode == 0
    out = ray_invar("use", "run", str(tmp_path / "foreign.contract.json"), "--run", str(tmp_path / "run"),
                     "--ray", cluster, "--quiet")  # the error line alone, no phase before it
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "the candidate worker is not the package the contract names: candidate.engine_version" in out.stderr
    with RunStore.open(tmp_path / "run") as store:
        assert store.calls() == []
