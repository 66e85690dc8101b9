"""The worker pool every command drives its workers with (`invar.runner.pool.WorkerPool`), with stand-in jobs: the
first failure halts the others and is what the pool raises, never the halt it caused; a barrier's action that
fails is raised as itself; no call is issued once the pool halted, even by a thread already waiting at the gate."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from invar.errors import EvidenceError
from invar.runner.pool import Halted, WorkerPool


def test_the_first_failure_halts_the_others_and_is_raised() -> None:
    pool = WorkerPool(3)
    waited = pool.barrier(3)
    ended: list[str] = []

    def waits(name: str) -> None:
        try:
            pool.wait(waited)  # never reached by the third: released by the halt
        finally:
            ended.append(name)

    def fails() -> None:
        time.sleep(0.1)
        raise EvidenceError("the candidate worker is not the package the contract names")

    with pytest.raises(EvidenceError, match="not the package"):
        pool.run([lambda: waits("a"), lambda: waits("b"), fails], stopped=lambda how: how)
    assert sorted(ended) == ["a", "b"]
    assert pool.stop.is_set()


def test_a_barrier_action_that_fails_is_raised_as_itself() -> None:
    pool = WorkerPool(2)

    def rule() -> None:
        raise ValueError("the rule could not be evaluated")

    ruled = pool.barrier(2, action=rule)

    def job() -> None:
        pool.wait(ruled)

    with pytest.raises(ValueError, match=r"^the rule could not be evaluated$"):
        pool.run([job, job], stopped=lambda how: how)


class _Lease:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def ask(self, method: str, params: dict[str, Any]) -> str:
        self.asked.append(method)
        return method


def test_no_call_is_issued_after_a_halt_even_from_the_gate() -> None:
    pool = WorkerPool(1, calls_at_once=1)
    lease = _Lease()
    holding, release = threading.Event(), threading.Event()
    answers: list[object] = []

    def holder() -> None:
        with pool._gate:  # a call under way holds the only slot
            holding.set()
            release.wait(10)

    def waiter() -> None:
        holding.wait(10)
        answers.append(pool.ask(lease, "generate", {}))  # type: ignore[arg-type]

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for t in threads:
        t.start()
    holding.wait(10)
    time.sleep(0.1)  # the waiter is in line at the gate
    pool.halt()
    release.set()
    for t in threads:
        t.join(10)
    assert answers == [None]
    assert lease.asked == []
    with pytest.raises(Halted):
        pool.ready()
