"""`invar train --ray` on the multi-node cluster (tests/cluster/netns_cluster.py): the inference worker goes to a
worker node, the learner stays with the command on the head, and the run publishes the local run's checkpoints;
when the inference worker's node is killed (every process on it) while the worker holds cycle 1's generate call,
a replacement on the other node loads cycle 0's checkpoint, answers that call again, and the run publishes the same
checkpoints, the lost call kept on record unanswered."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from netns_cluster import NetnsCluster, placements
from runner.train_helpers import check_finished, invar, published, write_config

from invar.records import RunStore

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("cluster-train"), "mlx-cluster", "mlx", cycles=2)


@pytest.fixture(scope="module")
def local(config: Path) -> Path:
    run = config.parent / "local"
    out = invar("train", config, "--run", run)
    assert out.returncode == 0, out.stderr
    return run


def test_train_places_its_inference_worker_on_a_worker_node(cluster: NetnsCluster, config: Path, local: Path,
                                                           tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = cluster.invar("train", str(config), "--run", str(run), "--ray", cluster.address)
    assert out.returncode == 0, out.stderr
    assert published(run) == published(local)
    same = invar("compare", "histories", local, run)
    assert same.returncode == 0, same.stdout + same.stderr
    placed = placements(run)
    assert len(placed) == 1  # the inference worker; the learner ran on the head, with the command
    assert placed[0]["node_ip"] in {n.ip for n in cluster.workers}


def _read(run: Path) -> tuple[dict[str, Any], list[Any]] | None:
    try:
        with RunStore.open(run) as store:
            return store.meta(), store.calls()
    except Exception:  # the run may not exist yet, or be mid-write
        return None


def test_the_inference_workers_node_killed_mid_call_is_replaced(cluster: NetnsCluster, config: Path, local: Path,
                                                                tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = cluster.popen_invar("train", str(config), "--run", str(run), "--ray", cluster.address, "--json")
    node = None
    try:
        # From cycle 0's learner step on, the worker runs in short slices between freezes (SIGSTOP) and the records
        # are read while it is frozen: a generate call on record without its report is then cycle 1's, held.
        deadline = time.monotonic() + 300
        seen = None
        while time.monotonic() < deadline and proc.poll() is None:
            seen = _read(run)
            if seen is not None and any(c.call.method == "learner_step" for c in seen[1]):
                break
            time.sleep(0.05)
        where = next((v for k, v in seen[0].items() if k.startswith("placement ")), None) if seen else None
        assert where is not None, "the run ended before cycle 0's learner step"
        node = next(n.name for n in cluster.workers if n.ip == where["node_ip"])
        lost = None
        while lost is None and time.monotonic() < deadline and proc.poll() is None:
            os.kill(where["worker_pid"], signal.SIGSTOP)
            time.sleep(0.2)
            seen = _read(run)
            held = [c for c in (seen[1] if seen else []) if c.call.method == "generate" and c.report is None]
            if held:
                lost = held[0]
                cluster.kill_node(node)
            else:
                os.kill(where["worker_pid"], signal.SIGCONT)
                time.sleep(0.03)
        assert lost is not None, "no generate call of cycle 1 was held to kill"
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if node is not None:
            cluster.revive(node)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    assert published(run) == published(local)
    check_finished(run, doc["chain_head"], 2, kl_coef=0.05)
    same = invar("compare", "histories", local, run)
    assert same.returncode == 0, same.stdout + same.stderr
    with RunStore.open(run) as store:
        calls = store.calls()
        meta = store.meta()
    assert [c.report for c in calls if c.call_digest == lost.call_digest] == [None]
    again = [c for c in calls if c.call.method == "generate" and c.call.params == lost.call.params
             and c.call_digest != lost.call_digest]
    assert len(again) == 1
    assert again[0].report is not None
    assert meta["cycle-000001"]["generate_call"] == again[0].call_digest
    # The replacement ran on the node left, and loaded cycle 0's checkpoint before it sampled with it.
    placed = {p["worker"]: p for p in placements(run)}
    assert placed[again[0].worker]["node_ip"] != where["node_ip"]
    loads = [c for c in calls if c.worker == again[0].worker and c.call.method == "load_adapter"]
    assert [c.call.params["digest"] for c in loads] == [published(run)[0]]
    cluster.wait_alive({n.ip for n in cluster.nodes.values()})
