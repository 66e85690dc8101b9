"""`invar train --ray`: inference workers placed as Ray actors on a local Ray cluster (the session's, loopback only)
publish the checkpoints of local ones; an inference worker whose relay actor (or the worker process itself) is
killed while it holds a generate call is replaced, the replacement loads the policy that call samples and answers
it again, and the run publishes the same checkpoints with the lost call kept on record unanswered.

Each `--ray` run here is one with a worker killed: it carries the undisturbed run's claims too (the local run's
checkpoints published, the same history, only inference workers placed on the cluster), so no Ray training run
is made for those alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import LOOPBACK_ENV, placements
from train_helpers import check_finished, invar, published, write_config

from invar.records import RunStore

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("train-ray"), "mlx-ray", "mlx", cycles=2)


@pytest.fixture(scope="module")
def local(config: Path) -> Path:
    run = config.parent / "local"
    out = invar("train", config, "--run", run)
    assert out.returncode == 0, out.stderr
    return run


def _read(run: Path) -> tuple[dict[str, Any], list[Any]] | None:
    try:
        with RunStore.open(run) as store:
            return store.meta(), store.calls()
    except Exception:  # the run may not exist yet, or be mid-write
        return None


def _kill_while_generating(run: Path, proc: subprocess.Popen[str], target: str) -> tuple[Any, dict[str, Any]]:
    """SIGKILL the inference worker's relay actor process (`actor_pid`) or the worker process itself (`worker_pid`)
    while the worker holds cycle 1's generate call (the one that samples cycle 0's checkpoint). Returns that call
    and where the worker ran.

    From cycle 0's learner step on (the inference worker idle, its next call cycle 1's) the worker is run in short
    slices between freezes (SIGSTOP), and the records are read while it is frozen: a generate call on record without
    its report is then cycle 1's, and the worker has had at most a slice to work on it."""
    deadline = time.monotonic() + 300
    seen = None
    while time.monotonic() < deadline and proc.poll() is None:
        seen = _read(run)
        if seen is not None and any(c.call.method == "learner_step" for c in seen[1]):
            break
        time.sleep(0.05)
    where = next((v for k, v in seen[0].items() if k.startswith("placement ")), None) if seen else None
    assert where is not None, "the run ended before cycle 0's learner step"
    while time.monotonic() < deadline and proc.poll() is None:
        os.kill(where["worker_pid"], signal.SIGSTOP)
        time.sleep(0.2)  # a report the worker wrote before the freeze reaches the records meanwhile
        seen = _read(run)
        held = [c for c in (seen[1] if seen else []) if c.call.method == "generate" and c.report is None]
        if held:
            os.kill(where[target], signal.SIGKILL)  # a killed actor's worker goes with it
            return held[0], where
        os.kill(where["worker_pid"], signal.SIGCONT)
        time.sleep(0.03)
    raise AssertionError("no generate call of cycle 1 was held to kill")


@pytest.mark.parametrize("target", ["actor_pid", "worker_pid"])
def test_a_killed_inference_worker_is_replaced_and_its_generate_call_answered_again(
        cluster: str, config: Path, local: Path, tmp_path: Path, target: str) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "train", str(config), "--run", str(run), "--ray",
                             cluster, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **LOOPBACK_ENV})
    try:
        lost, where = _kill_while_generating(run, proc, target)
    finally:
        stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    # The run publishes the local run's checkpoints, and its records are accepted as a training run's.
    assert published(run) == published(local)
    check_finished(run, doc["chain_head"], 2, kl_coef=0.05)
    same = invar("compare", "histories", local, run)
    assert same.returncode == 0, same.stdout + same.stderr
    assert invar("inspect", "history", run).returncode == 0
    with RunStore.open(run) as store:
        calls = store.calls()
        meta = store.meta()
        workers = store.workers()
    # The killed call stays on record unanswered; the same call was issued again to the replacement, which
    # answered it, and cycle 1's publication names that one.
    assert [c.report for c in calls if c.call_digest == lost.call_digest] == [None]
    again = [c for c in calls if c.call.method == "generate" and c.call.params == lost.call.params
             and c.call_digest != lost.call_digest]
    assert len(again) == 1
    assert again[0].report is not None
    assert again[0].report.report.ok
    assert again[0].worker != lost.worker
    assert meta["cycle-000001"]["generate_call"] == again[0].call_digest
    # The replacement loaded the published checkpoint of cycle 0 before it sampled with it, and declared the lost
    # worker's identity (its pid and instance aside).
    loads = [c for c in calls if c.worker == again[0].worker and c.call.method == "load_adapter"]
    assert [c.call.params["digest"] for c in loads] == [published(run)[0]]
    same_identity = [{k: v for k, v in workers[w].to_wire().items() if k not in ("pid", "instance")}
                     for w in (lost.worker, again[0].worker)]
    assert same_identity[0] == same_identity[1]
    # Only the inference workers were placed on the cluster (the first actor and its replacement); the learner ran
    # here, beside the core.
    placed = placements(run)
    assert len(placed) == 2
    assert {workers[p["worker"]].role.value for p in placed} == {"inference"}
    assert [ident.role.value for key, ident in workers.items() if key not in {p["worker"] for p in placed}] \
        == ["learner"]
    with pytest.raises(ProcessLookupError):
        os.kill(where["worker_pid"], 0)
