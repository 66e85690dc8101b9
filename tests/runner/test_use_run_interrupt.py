"""`use run` at a signal issues no further call: a worker thread that was waiting its turn at the call gate while
the signal came does not send its call once the gate lets it through (issue 51: it did, about a call's length after
the signal, where the operating guide says calls stop at once); and when the calls under way at a signal are the
plan's last and answer within the grace, the run closes instead of waiting for a resume that has nothing to do."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from contract.contract_runs import make_workspace
from support.fake_worker import ENGINE_VERSION, FakeTransport, FakeWorker, Script
from support.signals import command_line_handlers, sigterm_during_call

from invar.interrupts import Stopped
from invar.records import RunStore
from invar.runner.use_run import use_run


def test_a_call_waiting_at_the_gate_is_not_issued_after_sigterm(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=16, reference={"engine_version": ENGINE_VERSION},
                        candidate={"engine_version": ENGINE_VERSION, "patches": None},
                        execution={"requests_per_call": 8})
    sent: list[str] = []

    def report(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        sent.append(method)
        if len(sent) == 1:
            # The signal comes while this call computes and the other package's worker waits at the gate (one call
            # at a time); the call answers after the command has seen the signal.
            sigterm_during_call()
            time.sleep(0.5)  # the handler's interrupt reaching the pool's halt, on the main thread
        return result

    transport = FakeTransport(Script(report=report))
    with command_line_handlers(), \
            pytest.raises(Stopped, match=r"^stopped issuing calls at SIGTERM after 1 answered call"):
        use_run(ws.contract_path, tmp_path / "run", transport=transport, calls_at_once=1)
    assert [method for _, method in transport.received if method == "generate"] == ["generate"]
    with RunStore.open(tmp_path / "run") as store:
        assert [c.call.method for c in store.calls() if c.call.method == "generate"] == ["generate"]


def _sigterm_at(at: int, answered: list[str]) -> Callable[[FakeWorker, str, dict[str, Any]], dict[str, Any]]:
    """A fake worker's report hook that sends SIGTERM while the `at`-th planned call (1-based) computes, the call
    answering once the command has seen it; each call's method is appended to `answered`."""

    def report(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        answered.append(method)
        if len(answered) == at:
            sigterm_during_call()
            time.sleep(0.5)  # the handler's interrupt reaching the pool's halt, on the main thread
        return result

    return report


def test_sigterm_during_the_plans_last_call_closes_the_run(tmp_path: Path) -> None:
    # The calls under way at a signal may answer within the grace; when the last planned call does, nothing is left
    # to resume: the run closes and the outcome names the signal (one call earlier, the run stops as before).
    ws = make_workspace(tmp_path, units=16, reference={"engine_version": ENGINE_VERSION},
                        candidate={"engine_version": ENGINE_VERSION, "patches": None},
                        execution={"requests_per_call": 8})
    total = len(ws.plan.calls) + len(ws.plan.measurements)
    for at, run in ((total - 1, tmp_path / "stopped"), (total, tmp_path / "run")):
        answered: list[str] = []
        transport = FakeTransport(Script(report=_sigterm_at(at, answered)))
        if at < total:
            with command_line_handlers(), pytest.raises(Stopped, match=rf"^stopped issuing calls at SIGTERM after "
                                                                       rf"{at} answered call"):
                use_run(ws.contract_path, run, transport=transport, calls_at_once=1)
            with RunStore.open(run) as store:
                assert not store.verify().closed
            continue
        with command_line_handlers():
            outcome = use_run(ws.contract_path, run, transport=transport, calls_at_once=1)
        assert (outcome.signal, outcome.calls_issued, outcome.calls_total) == ("SIGTERM", total, total)
        assert len(answered) == total
        with RunStore.open(run) as store:
            assert store.verify(expect_head=outcome.head).closed
        again = use_run(ws.contract_path, run, transport=FakeTransport(Script()))
        assert (again.already_closed, again.head, again.signal) == (True, outcome.head, None)


def test_sigterm_during_the_look_where_a_sequential_rule_stops_closes_the_run(tmp_path: Path) -> None:
    # Identical packages and ε = 0.2: the rule stops after the second look of 16 units (tests/runner/
    # test_fake_worker_orchestration.py). A signal while that look's last call computes lets it answer; the rule then
    # stops there, as it would have, and the run closes. One call earlier, the look is not finished: the run stops,
    # and its resume comes to the same stop.
    ws = make_workspace(
        tmp_path / "ws", units=48, reference={"engine_version": ENGINE_VERSION},
        candidate={"engine_version": ENGINE_VERSION, "patches": None},
        requirement={"standard": "population", "epsilon": "0.2", "confidence": "0.95",
                     "method": "paired-binary-sequence", "sequential": True, "max_n": 48},
        pairing={"layout": "b16"}, layouts={"b16": {"batch_size": 16}}, invariance={"required": False, "layouts": None},
        execution={"requests_per_call": 16}, premises=[])
    whole = use_run(ws.contract_path, tmp_path / "whole", transport=FakeTransport())
    assert whole.stop is not None
    assert (whole.stop["look"], whole.calls_issued) == (2, 4)
    for at in (3, 4):
        run = tmp_path / f"signal-at-{at}"
        transport = FakeTransport(Script(report=_sigterm_at(at, [])))
        if at == 3:
            with command_line_handlers(), pytest.raises(Stopped, match=r"^stopped issuing calls at SIGTERM after 3 "):
                use_run(ws.contract_path, run, transport=transport, calls_at_once=1)
            outcome = use_run(ws.contract_path, run, transport=FakeTransport())
            assert (outcome.signal, outcome.calls_issued) == (None, 1)
        else:
            with command_line_handlers():
                outcome = use_run(ws.contract_path, run, transport=transport, calls_at_once=1)
            assert (outcome.signal, outcome.calls_issued) == ("SIGTERM", 4)
        assert outcome.stop is not None
        keys = ("answer", "look", "units")
        assert [outcome.stop[k] for k in keys] == [whole.stop[k] for k in keys]
        with RunStore.open(run) as store:
            assert store.verify(expect_head=outcome.head).closed
