"""`infer` drives its one worker through the command's `WorkerPool`, as `evaluate` and `score` do, here on the
in-process fake worker: Ctrl-C while the model loads stops at once, not after the load, and the records made so far
stay readable; Ctrl-C during the generate call lets it answer and be recorded."""

from __future__ import annotations

import _thread
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_worker import FakeTransport, Script
from support.signals import command_line_handlers, signalled, wait_for_handler

from invar.interrupts import Stopped
from invar.records import RunStore
from invar.runner import engine
from invar.runner import infer as infer_mod
from invar.runner.engine import Engine, EngineSpec
from invar.runner.infer import InferSampling, infer

LOAD_S = 60.0
"""A load far longer than the test may take: stopping at once means well before it ends."""
PROMPTS = ["37+58=", "12*7="]


def _on_fake(monkeypatch: pytest.MonkeyPatch, transport: FakeTransport) -> None:
    real = engine.engine_session

    @contextlib.contextmanager
    def session(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **{**kwargs, "placement": transport}) as started:
            yield started

    monkeypatch.setattr(infer_mod, "engine_session", session)


def _interrupt_when(received: Callable[[], bool]) -> None:
    """Ctrl-C in the main thread once `received()` holds (the fake worker got the call it waits for)."""
    def watch() -> None:
        deadline = time.monotonic() + 30
        while not received() and time.monotonic() < deadline:
            time.sleep(0.01)
        _thread.interrupt_main()

    threading.Thread(target=watch, daemon=True).start()


def _infer(root: Path, run: Path) -> Any:
    return infer(EngineSpec(Engine.HF, root / "models" / "tiny-arith"), PROMPTS, [None] * len(PROMPTS),
                 InferSampling(0, 0.0, 1.0, 4), run, call_timeout=None)


def test_ctrl_c_while_the_model_loads_stops_at_once_and_keeps_the_records(root: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport(script=Script(load_seconds=lambda number: LOAD_S))
    _on_fake(monkeypatch, transport)
    _interrupt_when(lambda: (1, "load_model") in transport.received)
    started = time.monotonic()
    with pytest.raises(Stopped, match=r"^stopped at Ctrl-C") as stopped:
        _infer(root, tmp_path / "run")
    assert time.monotonic() - started < LOAD_S / 2
    assert stopped.value.status == 130
    assert [m for _, m in transport.received] == ["load_model"]  # no generate call after the signal
    with RunStore.open(tmp_path / "run") as kept:  # the store verifies: what was recorded is all there
        kept.verify()
        calls = kept.calls()
        assert kept.meta()["run"]["command"] == "infer"
    assert [c.call.method for c in calls] == ["load_model"]
    assert calls[0].report is None  # the load was stopped, unanswered, and says so


def test_ctrl_c_during_the_call_lets_it_answer_and_be_recorded(root: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    asked = threading.Event()

    def slow(worker: Any, method: str, result: dict[str, Any]) -> dict[str, Any]:  # answers after the signal came
        if method == "generate":
            seen = signalled()
            asked.set()  # the watcher sends Ctrl-C
            wait_for_handler(seen)
            time.sleep(0.5)  # the handler's interrupt reaching the pool's halt, on the main thread
        return result

    transport = FakeTransport(script=Script(report=slow))
    _on_fake(monkeypatch, transport)
    _interrupt_when(asked.is_set)
    with command_line_handlers(), pytest.raises(Stopped, match=r"^stopped at Ctrl-C$"):
        _infer(root, tmp_path / "run")
    with RunStore.open(tmp_path / "run") as kept:
        kept.verify()
        calls = kept.calls()
    assert [c.call.method for c in calls] == ["load_model", "generate"]
    assert all(c.report is not None for c in calls)  # the call under way answered within the grace


def test_without_a_signal_the_call_is_answered_and_the_run_closed(root: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport()
    _on_fake(monkeypatch, transport)
    out = _infer(root, tmp_path / "run")
    assert [r.request_id for r in out.outputs] == ["0", "1"]
    with RunStore.open(tmp_path / "run") as kept:
        assert kept.closed
        assert kept.verify().head == out.chain_head
