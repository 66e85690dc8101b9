"""The bookkeeping of `invar train`'s rollouts when an inference worker is lost, with stand-in workers: the lost
worker's unanswered generate calls go to its replacement after the policy they sample is loaded into it, calls it
answered before it was lost stand, replacements are bounded (then one line), and a replacement must declare the
first worker's identity. The real loss (a Ray actor killed mid-call) is exercised in test_train_ray.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from train_helpers import write_config

from invar.errors import EvidenceError, ProtocolError
from invar.protocol.methods import Method
from invar.protocol.payloads import LoadAdapterParams, LoadAdapterResult
from invar.runner import train as tr
from invar.runner.engine import RESTARTS, Lease
from invar.runner.pool import WorkerPool
from invar.transport import WorkerLost


class _Worker:
    """A stand-in worker: answers in order what it was sent, until it is lost; then every call it has not answered
    is lost with it, and so is every later one."""

    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self.name, self.log, self.lost = name, log, False
        self.adapter: str | None = None

    def submit(self, method: str | Method[LoadAdapterParams, LoadAdapterResult],
               params: dict[str, Any] | LoadAdapterParams) -> _Call | _Load:
        if self.lost:
            raise WorkerLost(f"{self.name}: cannot write to the worker")
        if isinstance(params, LoadAdapterParams):
            assert not isinstance(method, str)
            self.adapter = params.digest  # the calls that follow it sample it: a worker serves them in order
            self.log.append((self.name, method.name, params.digest))
            return _Load(self, LoadAdapterResult(params.name, params.digest))  # as every worker answers it
        assert isinstance(method, str)
        self.log.append((self.name, method, params["requests"][0]["request_id"]))
        return _Call(self, params, self.adapter)


class _Load:
    def __init__(self, worker: _Worker, result: LoadAdapterResult) -> None:
        self.worker, self.got, self.answered = worker, result, False

    def result(self) -> dict[str, Any]:
        if self.worker.lost and not self.answered:
            raise WorkerLost(f"{self.worker.name}: the Ray actor relaying the worker is gone (ActorDiedError)")
        self.answered = True
        return self.got.to_wire()


class _Call:
    def __init__(self, worker: _Worker, params: dict[str, Any], adapter: str | None) -> None:
        self.worker, self.params, self.adapter, self.answered = worker, params, adapter, False
        self.call_digest = params["requests"][0]["request_id"]  # the same bytes when issued again
        _STORE.recorded.append(self.call_digest)

    def answer(self) -> tuple[str, str, str | None]:
        if self.worker.lost and not self.answered:
            raise WorkerLost(f"{self.worker.name}: the Ray actor relaying the worker is gone (ActorDiedError)")
        self.answered = True
        return self.worker.name, self.params["requests"][0]["request_id"], self.adapter


class _Store:
    """A stand-in store: each call's record is its place in the order the calls were issued."""

    def __init__(self) -> None:
        self.recorded: list[str] = []

    def call_seq(self, digest: str) -> int | None:
        return max((i + 1 for i, d in enumerate(self.recorded) if d == digest), default=None)


_STORE = _Store()


class _Session:
    def __init__(self, client: _Worker) -> None:
        self.client = client


def _leases(slots: int, restarts: int, log: list[tuple[str, str, Any]],
            workers: dict[str, _Worker]) -> list[Lease]:
    def starter(slot: int) -> Callable[[Callable[[], object]], Any]:
        @contextlib.contextmanager
        def start(ready: Callable[[], object]) -> Iterator[_Session]:
            name = f"w{slot}.{len([n for n in workers if n.startswith(f'w{slot}.')])}"
            workers[name] = _Worker(name, log)
            yield _Session(workers[name])
        return start
    return [Lease(starter(i), lambda: None, restarts, f"the inference worker {i + 1}") for i in range(slots)]


def _rollouts(tmp_path: Path, leases: list[Lease], **rollout: Any) -> tr._Rollouts:
    config = write_config(tmp_path, "stand-in", "mlx", cycles=4, rollout=rollout)
    _STORE.recorded.clear()
    return tr._Rollouts(tr.plan(config), leases, _STORE, WorkerPool(1))  # type: ignore[arg-type]


def _published(n: int) -> tr.Published:
    return tr.Published(n, Path(f"/nowhere/cycle-{n}"), f"digest-{n}", n + 1)


def test_a_lost_workers_call_is_answered_by_a_replacement_that_loaded_its_policy(tmp_path: Path) -> None:
    log: list[tuple[str, str, Any]] = []
    workers: dict[str, _Worker] = {}
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(lease) for lease in _leases(2, RESTARTS, log, workers)]
        rollouts = _rollouts(tmp_path, leases, workers=2)
        _, answers = rollouts.take(0, [])
        assert [a[0] for a in answers] == ["w0.0", "w1.0"]
        done = [_published(0)]
        rollouts.start(1, done)
        workers["w0.0"].lost = True  # while it holds cycle 1's call
        pending, answers = rollouts.take(1, done)
        # The call went twice with the same bytes; the cycle names the record of the copy that was answered.
        assert _STORE.recorded.count(_STORE.recorded[-1]) == 2
        assert pending.seqs[0] == len(_STORE.recorded)
    # The replacement loaded cycle 0's checkpoint, then answered the lost call, with the same params.
    assert [a[0] for a in answers] == ["w0.1", "w1.0"]
    assert answers[0][2] == "digest-0"
    lost = [e for e in log if e[0] == "w0.0" and e[1] == "generate"][-1]
    assert log[-2:] == [("w0.1", "load_adapter", "digest-0"), ("w0.1", "generate", lost[2])]
    assert [lease.replaced for lease in leases] == [1, 0]


def test_calls_answered_before_the_loss_stand(tmp_path: Path) -> None:
    log: list[tuple[str, str, Any]] = []
    workers: dict[str, _Worker] = {}
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(lease) for lease in _leases(1, RESTARTS, log, workers)]
        rollouts = _rollouts(tmp_path, leases, staleness=1)  # cycles 0 and 1 sample the base model
        rollouts.take(0, [])
        rollouts.ahead(0, [])  # cycle 1 starts while cycle 0's learner works ...
        assert list(rollouts.pending) == [1]
        rollouts.pending[1].calls[0].answer()  # type: ignore[union-attr]  # ... and is answered
        workers["w0.0"].lost = True
        # once cycle 0's learner reported, cycle 2 (which samples its update) starts: its calls meet the lost worker
        # and go to a replacement
        rollouts.ahead(0, [_published(0)])
        assert leases[0].replaced == 1
        _, answers = rollouts.take(1, [_published(0)])
        assert answers[0][0] == "w0.0"  # kept, not issued again
        _, answers = rollouts.take(2, [_published(0), _published(1)])
    assert answers[0][:3:2] == ("w0.1", "digest-0")
    assert [e[1] for e in log if e[0] == "w0.1"] == ["load_adapter", "generate"]
    assert leases[0].replaced == 1


def test_replacements_are_bounded_and_the_stop_is_one_line(tmp_path: Path) -> None:
    log: list[tuple[str, str, Any]] = []

    class Lost(dict[str, _Worker]):
        def __setitem__(self, key: str, value: _Worker) -> None:
            value.lost = True  # every worker is lost before its first call
            super().__setitem__(key, value)

    workers = Lost()
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(lease) for lease in _leases(1, RESTARTS, log, workers)]
        rollouts = _rollouts(tmp_path, leases)
        with pytest.raises(ProtocolError) as stopped:
            rollouts.take(0, [])
    assert len(workers) == RESTARTS + 1
    assert str(stopped.value) == (f"the inference worker 1 was lost {RESTARTS + 1} times (replaced {RESTARTS} "
                                  "times); last: w0.3: cannot write to the worker")


def test_without_ray_a_lost_worker_stops_the_cycle(tmp_path: Path) -> None:
    log: list[tuple[str, str, Any]] = []
    workers: dict[str, _Worker] = {}
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(lease) for lease in _leases(1, 0, log, workers)]
        rollouts = _rollouts(tmp_path, leases)
        rollouts.start(0, [])
        workers["w0.0"].lost = True
        with pytest.raises(WorkerLost, match=r"w0\.0: the Ray actor"):
            rollouts.take(0, [])
    assert list(workers) == ["w0.0"]


def test_a_replacement_must_declare_the_first_workers_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = iter([{"engine": "mlx", "settings": {"threads": 1}, "pid": 1},
                     {"engine": "mlx", "settings": {"threads": 1}, "pid": 2},
                     {"engine": "mlx", "settings": {"threads": 1}, "pid": 3},
                     {"engine": "mlx", "settings": {"threads": 2}, "pid": 4}])

    class Identity:
        def __init__(self) -> None:
            self.wire = next(declared)

        def to_wire(self) -> dict[str, Any]:
            return self.wire

    class Client:
        identity = property(lambda self: self._identity)

        def __init__(self) -> None:
            self._identity = Identity()

    @contextlib.contextmanager
    def session(*args: Any, **kwargs: Any) -> Iterator[Any]:
        yield _Session(Client())  # type: ignore[arg-type]

    monkeypatch.setattr(tr, "engine_session", session)
    start = tr._InferenceStart(None, None, None, None, WorkerPool(1))  # type: ignore[arg-type]
    # The workers started together are declared once all have started, worker 1 first.
    with start(lambda: None) as one, start(lambda: None) as two:
        start.declare(one)
        start.declare(two)  # differs only in its pid
    with start(lambda: None):  # a replacement that declares the same
        pass
    with pytest.raises(EvidenceError) as refused, start(lambda: None):
        pass
    assert str(refused.value) == ("an inference worker declares settings {'threads': 2}, unlike the run's first "
                                  "inference worker ({'threads': 1}); every inference worker must be the same "
                                  "engine, versions and settings: install the same on every node")


def test_a_load_of_another_checkpoint_is_refused_before_its_rollouts_are_read(tmp_path: Path) -> None:
    # The load is not awaited when it is issued (the worker serves its calls in order); its answer is checked when
    # the cycle takes its rollouts, before any is read.
    log: list[tuple[str, str, Any]] = []
    workers: dict[str, _Worker] = {}
    with contextlib.ExitStack() as stack:
        leases = [stack.enter_context(lease) for lease in _leases(1, RESTARTS, log, workers)]
        rollouts = _rollouts(tmp_path, leases)
        rollouts.take(0, [])
        rollouts.start(1, [_published(0)])
        load = rollouts.pending[1].loads[0]
        assert isinstance(load, _Load)
        load.got = LoadAdapterResult(load.got.name, "digest-other")  # a worker that loaded something else
        with pytest.raises(EvidenceError) as refused:
            rollouts.take(1, [_published(0)])
    assert str(refused.value) == "cycle 1: the engine loaded digest-other…, not the published checkpoint digest-0…"
    assert [e[1] for e in log] == ["generate", "load_adapter", "generate"]
