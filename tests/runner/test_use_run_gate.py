"""The gate `use run` puts in front of the workers' calls when they cannot all compute at once
(`invar.runner.pool.Gate`): at most its slots held, and taken in the order asked, so a worker that finishes a
call and asks again waits behind the workers already waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from invar.runner.pool import Gate as _Gate


def _wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_worker_that_asks_again_waits_behind_those_already_waiting() -> None:
    gate = _Gate(1)
    order: list[str] = []
    release_a = threading.Event()

    def a() -> None:
        with gate:
            order.append("a")
            release_a.wait(10)
        with gate:  # asks again at once: B and C asked first
            order.append("a")

    def other(name: str) -> None:
        with gate:
            order.append(name)

    threads = [threading.Thread(target=a)]
    threads[0].start()
    _wait_until(lambda: order == ["a"])
    for waiting, name in enumerate(("b", "c"), start=1):
        threads.append(threading.Thread(target=other, args=(name,)))
        threads[-1].start()
        _wait_until(lambda w=waiting: len(gate._waiting) == w)  # b is in line before c asks
    release_a.set()
    for t in threads:
        t.join(10)
    assert order == ["a", "b", "c", "a"]


def test_never_more_holders_than_slots_and_an_interrupted_wait_leaves_the_line() -> None:
    gate = _Gate(2)
    inside, most = [0], [0]
    lock = threading.Lock()

    def work() -> None:
        for _ in range(20):
            with gate:
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 2

    # A waiter interrupted in line (Ctrl-C in its thread) leaves it; the one behind it is not blocked.
    gate = _Gate(1)
    gate.__enter__()
    stopped = threading.Event()

    def interrupted() -> None:
        def stop_waiting(*_: object) -> bool:
            raise KeyboardInterrupt

        original = gate._cond.wait_for
        gate._cond.wait_for = stop_waiting  # type: ignore[method-assign]
        try:
            gate.__enter__()
        except KeyboardInterrupt:
            stopped.set()
        finally:
            gate._cond.wait_for = original  # type: ignore[method-assign]

    t = threading.Thread(target=interrupted)
    t.start()
    t.join(10)
    assert stopped.is_set()
    assert not gate._waiting
    gate.__exit__(None, None, None)
    entered = threading.Event()

    def after() -> None:
        with gate:
            entered.set()

    t = threading.Thread(target=after)
    t.start()
    t.join(10)
    assert entered.is_set()
