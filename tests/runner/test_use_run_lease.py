"""A Ray-placed worker that is lost is replaced and its call issued again, a bounded number of times: the
bookkeeping of `use run`'s worker lease, with stand-in sessions (the real replacement is exercised on a Ray cluster
in test_use_run_ray.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from invar.errors import ProtocolError
from invar.runner.engine import RESTARTS, Lease
from invar.transport import WorkerLost


class _Client:
    def __init__(self, n: int, lose: bool) -> None:
        self.n, self.lose, self.asked = n, lose, 0

    def ask(self, method: str, params: dict[str, Any]) -> Any:
        self.asked += 1
        if self.lose:
            raise WorkerLost(f"worker {self.n}: the Ray actor relaying the worker is gone (ActorDiedError)\n"
                             "  stderr tail")
        return ("answer", self.n, method, params)


class _Session:
    def __init__(self, client: _Client) -> None:
        self.client = client


def _starter(lost: Callable[[int], bool], log: list[str]) -> Callable[[Callable[[], object]], Any]:
    @contextlib.contextmanager
    def start(ready: Callable[[], object]) -> Iterator[_Session]:
        n = len([e for e in log if e.startswith("start")])
        log.append(f"start {n}")
        ready()
        try:
            yield _Session(_Client(n, lost(n)))
        finally:
            log.append(f"stop {n}")
    return start


def test_a_lost_worker_is_replaced_and_the_call_issued_to_the_replacement() -> None:
    log: list[str] = []
    readies: list[int] = []
    with Lease(_starter(lambda n: n == 0, log), lambda: readies.append(1), 3, "the reference worker 1") as lease:
        assert lease.ask("generate", {"k": 1}) == ("answer", 1, "generate", {"k": 1})
    assert log == ["start 0", "stop 0", "start 1", "stop 1"]
    assert readies == [1]  # only the first start waits at the run's barrier


def test_replacements_are_bounded_and_the_stop_is_one_line() -> None:
    log: list[str] = []
    with Lease(_starter(lambda n: True, log), lambda: None, RESTARTS, "the candidate worker 2") as lease, \
            pytest.raises(ProtocolError) as stopped:
        lease.ask("generate", {})
    assert len([e for e in log if e.startswith("start")]) == RESTARTS + 1
    assert str(stopped.value) == (f"the candidate worker 2 was lost {RESTARTS + 1} times (replaced {RESTARTS} "
                                  "times); last: worker 3: the Ray actor relaying the worker is gone (ActorDiedError)")


def test_without_replacements_a_loss_is_the_workers_own_error() -> None:
    log: list[str] = []
    with Lease(_starter(lambda n: True, log), lambda: None, 0, "the reference worker 1") as lease, \
            pytest.raises(WorkerLost, match="worker 0: the Ray actor"):
        lease.ask("generate", {})
    assert log == ["start 0", "stop 0"]
