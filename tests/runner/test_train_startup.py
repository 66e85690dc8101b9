"""`invar train` starts its workers together: every inference worker and the learner start at once (their spawn,
imports, handshake and model load overlap), worker 1's identity is the one the others must declare whichever
finished first, and a start-up that fails (a worker that dies, a refusal, Ctrl-C) stops every worker that did start.

The pool's start-up (`WorkerPool.start`) is tested with stand-in context managers; the engine tests run real MLX
workers (the sabotaged module of test_train_mlx.py): the learner is recorded before the inference worker's slowed
model load is answered, and a learner that dies during its start-up leaves one error line, the run's records, and no
worker process behind.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from train_helpers import write_config

from invar.errors import EvidenceError, ProtocolError
from invar.records import RunStore
from invar.runner import train as tr
from invar.runner.pool import WorkerPool


class _Start:
    """A stand-in start-up: enters after `delay` seconds (or raises `fail`), checking `ready` as a worker does
    between its handshake and its model load; logs when it entered and exited."""

    def __init__(self, name: str, log: list[tuple[str, str, float]], delay: float = 0.0,
                 fail: BaseException | None = None, ready: Any = None, interrupt: bool = False,
                 together: threading.Barrier | None = None) -> None:
        self.name, self.log, self.delay, self.fail, self.ready, self.interrupt = name, log, delay, fail, ready, \
            interrupt
        self.together = together

    @contextlib.contextmanager
    def session(self) -> Iterator[str]:
        if self.interrupt:
            _thread.interrupt_main()
        if self.together is not None:  # passes only once every start-up is under way at the same time
            self.together.wait(timeout=60)
        time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        if self.ready is not None:
            self.ready()
        self.log.append((self.name, "enter", time.monotonic()))
        try:
            yield self.name
        finally:
            self.log.append((self.name, "exit", time.monotonic()))


def _start_together(stack: contextlib.ExitStack, managers: list[Any], pool: WorkerPool) -> list[Any]:
    return pool.start(stack, managers)


def _ready(pool: WorkerPool) -> Any:
    return pool.ready


def test_the_start_ups_overlap_and_come_back_in_order() -> None:
    log: list[tuple[str, str, float]] = []
    pool = WorkerPool(3)
    # Start-ups one after another would break the barrier (the first waits for the others in vain), a time-free
    # proof that they overlap.
    together = threading.Barrier(3)
    with contextlib.ExitStack() as stack:
        got = _start_together(stack, [_Start("worker 1", log, 1.0, together=together).session(),
                                      _Start("worker 2", log, 0.1, together=together).session(),
                                      _Start("learner", log, 1.0, together=together).session()], pool)
        assert got == ["worker 1", "worker 2", "learner"]  # in the order given, not the order they finished
        assert log[0][0] == "worker 2"  # it finished first
    assert not together.broken
    # Exited in reverse order of the list, as if entered one after the other.
    assert [name for name, what, _ in log if what == "exit"] == ["learner", "worker 2", "worker 1"]
    assert not pool.stop.is_set()


def test_a_failed_start_up_stops_the_others_and_its_error_is_raised() -> None:
    log: list[tuple[str, str, float]] = []
    pool = WorkerPool(3)
    ready = _ready(pool)
    refused = ProtocolError("mlx-learner: bad handshake: end of stream before the handshake (exit code 3)")
    with pytest.raises(ProtocolError) as err, contextlib.ExitStack() as stack:
        _start_together(stack, [
            _Start("worker 1", log, 0.0, ready=ready).session(),  # started before the failure
            _Start("worker 2", log, 0.8, ready=ready).session(),  # reaches its model load after it: gives up
            _Start("learner", log, 0.2, fail=refused).session()], pool)
    assert err.value is refused  # the failure, not the start-up it made moot
    assert pool.stop.is_set()
    assert [(name, what) for name, what, _ in log] == [("worker 1", "enter"), ("worker 1", "exit")]


def test_the_first_failure_in_order_is_raised() -> None:
    pool = WorkerPool(3)
    with pytest.raises(EvidenceError, match=r"^worker 2$"), contextlib.ExitStack() as stack:
        _start_together(stack, [_Start("worker 1", [], 0.0).session(),
                                   _Start("worker 2", [], 0.3, fail=EvidenceError("worker 2")).session(),
                                   _Start("learner", [], 0.0, fail=EvidenceError("learner")).session()], pool)


def test_an_interrupt_waits_for_every_start_up_and_stops_what_started() -> None:
    log: list[tuple[str, str, float]] = []
    pool = WorkerPool(3)
    ready = _ready(pool)
    with pytest.raises(KeyboardInterrupt), contextlib.ExitStack() as stack:
        _start_together(stack, [
            _Start("worker 1", log, 0.3, interrupt=True).session(),  # past its check: it starts, then is stopped
            _Start("learner", log, 2.0, ready=ready).session()], pool)  # checks after the interrupt: gives up
    assert [(name, what) for name, what, _ in log] == [("worker 1", "enter"), ("worker 1", "exit")]
    assert not any(t.name.startswith("invar-start-") for t in threading.enumerate())


def test_worker_1_is_the_identity_the_others_must_declare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker 2 starts first and declares other settings: the refusal names worker 1's as the run's, and every
    # worker started is stopped.
    log: list[tuple[str, str]] = []
    # By the start-up thread's index (the lease's): which thread calls first is not fixed.
    started = {"invar-start-0": ("inference 1", 0.6, {"threads": 1}), "invar-start-1": ("inference 2", 0.0,
                                                                                         {"threads": 2})}

    class Identity:
        def __init__(self, settings: dict[str, Any]) -> None:
            self.settings = settings

        def to_wire(self) -> dict[str, Any]:
            return {"engine": "mlx", "settings": self.settings, "pid": id(self)}

    class Session:
        def __init__(self, settings: dict[str, Any]) -> None:
            self.client = self
            self.identity = Identity(settings)
            self.adapter_digest = None

    @contextlib.contextmanager
    def session(spec: Any, store: Any, *, role: Any = tr.Role.INFERENCE, ready: Any = None,
                **kwargs: Any) -> Iterator[Any]:
        name, delay, settings = started[threading.current_thread().name] if role is tr.Role.INFERENCE else \
            ("learner", 0.3, {})
        time.sleep(delay)
        log.append((name, "enter"))
        try:
            yield Session(settings)
        finally:
            log.append((name, "exit"))

    monkeypatch.setattr(tr, "engine_session", session)
    p = tr.plan(write_config(tmp_path, "two-workers", "mlx", cycles=1, rollout={"workers": 2}))
    with pytest.raises(EvidenceError) as refused:
        tr._run_cycles(p, tmp_path / "run", None, [], None, lambda progress: None)  # type: ignore[arg-type]
    assert str(refused.value).startswith("an inference worker declares settings {'threads': 2}, unlike the run's "
                                         "first inference worker ({'threads': 1})")
    assert [name for name, what in log if what == "enter"] == ["inference 2", "learner", "inference 1"]
    assert sorted(name for name, what in log if what == "exit") == ["inference 1", "inference 2", "learner"]


def _alive(pid: int) -> bool:
    """Whether `ps` still lists the process (a zombie counts: nobody waited for it)."""
    return subprocess.run(["ps", "-o", "pid=", "-p", str(pid)], capture_output=True).returncode == 0


def _marked(mark: str) -> list[int]:
    """The processes whose environment carries `mark`: every worker a test's run started inherits it."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"INVAR_TEST_MARK={mark}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
    return found


@pytest.fixture
def sabotaged(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    from invar.engines import ENGINES

    monkeypatch.setitem(ENGINES, "mlx", "tests.runner.sabotaged_mlx")
    # The sabotaged module lives in the checkout's tests/, not in the package: put the checkout on the workers' path.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]),
                                                                 os.environ.get("PYTHONPATH", "")) if p))
    mark = f"{request.node.name}-{time.time_ns()}"
    monkeypatch.setenv("INVAR_TEST_MARK", mark)
    return mark


@pytest.mark.engine
def test_the_learner_starts_while_the_inference_worker_loads(tmp_path: Path, sabotaged: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVAR_SABOTAGE", "slow-load")  # the inference worker's load_model answers 4 s late
    config = write_config(tmp_path, "mlx-startup", "mlx", cycles=1)
    run = tmp_path / "run"
    tr.train(config, run)
    with RunStore.open(run) as store:
        assert store.verify().closed
        calls = store.calls()
    loads = {c.identity.role.value: c for c in calls if c.call.method == "load_model"}
    inference, learner = loads["inference"], loads["learner"]
    assert inference.report is not None
    generate = next(c for c in calls if c.call.method == "generate")
    t0 = min(c.at_ns for c in calls)
    print(f"measured: inference load_model sent {(inference.at_ns - t0) / 1e9:.2f} s, answered "
          f"{(inference.report.at_ns - t0) / 1e9:.2f} s; learner load_model sent {(learner.at_ns - t0) / 1e9:.2f} s; "
          f"first generate {(generate.at_ns - t0) / 1e9:.2f} s")
    # One after the other, the learner would start only once the inference worker's load_model was answered.
    assert learner.at_ns < inference.report.at_ns


@pytest.mark.engine
def test_a_learner_that_dies_while_starting_stops_the_inference_worker(tmp_path: Path, sabotaged: str) -> None:
    # Through `invar train`, with the sabotaged worker module standing in for the MLX worker.
    code = ("import sys; from invar.engines import ENGINES; ENGINES['mlx'] = 'tests.runner.sabotaged_mlx'; "
            "from invar.cli.app import main; sys.argv[0] = 'invar'; main()")
    config = write_config(tmp_path, "mlx-learner-dies", "mlx", cycles=1)
    run = tmp_path / "run"
    env = {**os.environ, "INVAR_SABOTAGE": "learner-dies"}
    out = subprocess.run([sys.executable, "-c", code, "train", str(config), "--run", str(run), "--quiet"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert re.fullmatch(r"invar: error: mlx-learner: bad handshake: end of stream before the handshake \(exit code "
                        r"3\)\. Every record so far is kept in .*; resume with: invar train .* --run .*\n",
                        out.stderr), out.stderr
    with RunStore.open(run) as store:
        v = store.verify()
        workers = store.workers()
        calls = store.calls()
    assert not v.closed
    assert v.unanswered == []
    # The inference worker had started (recorded, its model loaded) when the learner died; it was stopped.
    assert [ident.role.value for ident in workers.values()] == ["inference"]
    assert [c.call.method for c in calls] == ["load_model"]
    assert calls[0].report is not None
    pids = [ident.pid for ident in workers.values()]
    assert not [pid for pid in pids if _alive(pid)], f"workers {pids} outlived the failed start"
    assert _marked(sabotaged) == [], "a worker of the run is still running"
