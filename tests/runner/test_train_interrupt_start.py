"""`train` at a signal, on the in-process fake workers: Ctrl-C while the workers load their models stops them at
once (a load has no answer worth the wait), keeps the records made so far, and the same command resumes to the
uninterrupted run's checkpoint; once the pool has halted no rollout is issued, not even the next cycles' (staleness
K ≥ 1) started while the learner works."""

from __future__ import annotations

import _thread
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.fake_worker import FakeTransport, Script
from train_helpers import published, write_config

from invar.records import RunStore
from invar.runner import train as train_mod
from invar.runner.engine import Lease, Session
from invar.runner.pool import Halted, WorkerPool
from invar.runner.train import train

LOAD_S = 60.0
"""A load far longer than the test may take: stopping at once means well before it ends."""
SCRIPT = Script(wrong=lambda w: 0.5, policy_logprobs=True)


def test_ctrl_c_while_the_workers_load_stops_them_at_once_and_the_run_resumes(tmp_path: Path) -> None:
    config = write_config(tmp_path, "one", "mlx", cycles=1, rollout={"batch_size": 32})
    loading = FakeTransport(Script(wrong=SCRIPT.wrong, policy_logprobs=True, load_seconds=lambda number: LOAD_S))

    def interrupt() -> None:  # once both workers (inference and learner) are loading
        deadline = time.monotonic() + 30
        while sum(1 for _, m in loading.received if m == "load_model") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    run = tmp_path / "run"
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        train(config, run, transport=loading)
    assert time.monotonic() - started < LOAD_S / 2
    assert [m for _, m in loading.received] == ["load_model", "load_model"]  # no call after the signal
    with RunStore.open(run) as store:
        summary = store.verify()
        calls = store.calls()
    assert not summary.closed
    assert [c.call.method for c in calls] == ["load_model", "load_model"]
    assert all(c.report is None for c in calls)  # stopped unanswered, and on record as such

    resumed = train(config, run, transport=FakeTransport(SCRIPT))
    assert (resumed.cycles, resumed.cycles_reused) == (1, 0)
    fresh = tmp_path / "fresh"
    train(config, fresh, transport=FakeTransport(SCRIPT))
    assert published(run) == published(fresh)


def test_no_rollout_is_issued_once_the_pool_halted(tmp_path: Path) -> None:
    p = train_mod.plan(write_config(tmp_path, "stale", "mlx", cycles=3, rollout={"staleness": 1}))

    @contextlib.contextmanager
    def never(ready: Callable[[], object]) -> Iterator[Session]:
        raise AssertionError("no worker starts here")
        yield  # pragma: no cover

    pool = WorkerPool(1)
    pool.halt()  # a signal came while the learner worked
    with RunStore.create(tmp_path / "run", meta={"command": "train"}) as store:
        rollouts = train_mod._Rollouts(p, [Lease(never, pool.ready, 0, "the inference worker 1")], store, pool)
        with pytest.raises(Halted):
            rollouts.ahead(0, [])  # cycle 1 samples the base model: its rollouts would start now
        assert store.calls() == []
