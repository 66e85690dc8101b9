"""`use run` at a signal issues no further call: a worker thread that was waiting its turn at the call gate while
the signal came does not send its call once the gate lets it through (issue 51: it did, about a call's length after
the signal, where the operating guide says calls stop at once)."""

from __future__ import annotations

import time
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
