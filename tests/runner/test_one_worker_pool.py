"""`evaluate` and `score` drive their one worker through the command's `WorkerPool`, here on the in-process fake
worker: Ctrl-C while the model loads stops at once, not after the load; Ctrl-C during a call lets it answer and be
recorded, and no call starts after it; a worker lost mid-call is its own error, not a halt."""

from __future__ import annotations

import _thread
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fake_worker import FakeTransport, Fault, Script
from support.signals import command_line_handlers, signalled, wait_for_handler

from invar.errors import ProtocolError
from invar.interrupts import Stopped
from invar.records import RunStore
from invar.runner import engine, evaluate, score
from invar.runner.engine import Engine, EngineSpec
from invar.runner.evaluate import EvaluationSettings, evaluate_policy, population_digest
from invar.runner.score import ScoreItem, score_batches
from invar.tasks.population import load_units
from invar.tasks.scorers import load_scorer

LOAD_S = 60.0
"""A load far longer than the test may take: stopping at once means well before it ends."""


def _on_fake(monkeypatch: pytest.MonkeyPatch, transport: FakeTransport) -> None:
    real = engine.engine_session

    @contextlib.contextmanager
    def session(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **{**kwargs, "placement": transport}) as started:
            yield started

    for module in (evaluate, score):
        monkeypatch.setattr(module, "engine_session", session)


def _interrupt_when(received: Callable[[], bool]) -> threading.Thread:
    """Ctrl-C in the main thread once `received()` holds (the fake worker got the call it waits for)."""
    def watch() -> None:
        deadline = time.monotonic() + 30
        while not received() and time.monotonic() < deadline:
            time.sleep(0.01)
        _thread.interrupt_main()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _evaluate(root: Path, store: RunStore, count: int = 8) -> dict[str, Any]:
    population = root / "data" / "arith-eval.jsonl"
    units = list(load_units(population, population_digest(population, None)))[:count]
    return evaluate_policy(EngineSpec(Engine.HF, root / "models" / "tiny-arith"), units,
                           EvaluationSettings(0, 0.0, 1.0, 8, 2, 0.95), store,
                           load_scorer("exact-match", {}, root))


def test_ctrl_c_while_the_model_loads_stops_at_once(root: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport(script=Script(load_seconds=lambda number: LOAD_S))
    _on_fake(monkeypatch, transport)
    _interrupt_when(lambda: (1, "load_model") in transport.received)
    started = time.monotonic()
    with RunStore.create(tmp_path / "run", meta={"command": "evaluate"}) as store, \
            pytest.raises(Stopped, match=r"^stopped at Ctrl-C") as stopped:
        _evaluate(root, store)
    assert time.monotonic() - started < LOAD_S / 2
    assert stopped.value.status == 130
    assert [m for _, m in transport.received] == ["load_model"]  # no call after it


def test_ctrl_c_during_a_call_lets_it_answer_and_starts_no_other(root: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    first = threading.Event()

    def slow(worker: Any, method: str, result: dict[str, Any]) -> dict[str, Any]:  # answers after the signal came
        if method == "generate" and not first.is_set():
            seen = signalled()
            first.set()  # the watcher sends Ctrl-C
            wait_for_handler(seen)
            time.sleep(0.5)  # the handler's interrupt reaching the pool's halt, on the main thread
        return result

    transport = FakeTransport(script=Script(report=slow))
    _on_fake(monkeypatch, transport)
    _interrupt_when(first.is_set)
    with command_line_handlers(), RunStore.create(tmp_path / "run", meta={"command": "evaluate"}) as store, \
            pytest.raises(Stopped, match=r"^stopped at Ctrl-C$"):
        _evaluate(root, store)
    with RunStore.open(tmp_path / "run") as kept:
        calls = kept.calls()
    assert [c.call.method for c in calls] == ["load_model", "generate"]
    assert all(c.report is not None for c in calls)  # the call under way answered and was recorded


def test_a_worker_lost_mid_call_is_its_own_error(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport(faults=[Fault("die", "score")])
    _on_fake(monkeypatch, transport)
    item = ScoreItem("a", "1+1=", np.array([5, 6], dtype=np.int32), 1.0, (), (4, 5))
    with RunStore.create(tmp_path / "run", meta={"command": "score"}) as store, \
            pytest.raises(ProtocolError, match="exit code -9"):
        score_batches(EngineSpec(Engine.HF, root / "models" / "tiny-arith"), iter([[item]]), store)
