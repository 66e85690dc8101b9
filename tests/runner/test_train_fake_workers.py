"""`train`'s orchestration against in-process fake workers (tests/support/fake_worker.py), as the fast `use run`
tests drive it: schedules that split the rollouts over two inference workers or engine batches of 1 publish the
checkpoints of one worker's whole batch; a declared staleness of 1 samples cycle 1 from the base model and differs
from cycle 1 on; a run stopped by a lost learner or by SIGTERM resumes to the uninterrupted run's checkpoints; a
lost inference worker is replaced and its call issued again; the shared layout (both roles in one process) publishes
the split layout's checkpoints and, its process lost, resumes to them. The fakes speak the real protocol, their
calls are recorded by the real store and their checkpoints pass the core's checks, so every claim here is about the
core; what real learners compute is for the `engine` tests (test_train_schedules.py)."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support.fake_worker import FakeSharedProcess, FakeTransport, FakeWorker, Fault, Script
from support.signals import command_line_handlers, sigterm_during_call
from train_helpers import history, published, write_config

from invar import canonical
from invar.interrupts import Stopped
from invar.protocol import Role
from invar.records import RunStore
from invar.runner import train as train_mod
from invar.runner.train import train
from invar.transport import WorkerLost

SCRIPT = Script(wrong=lambda w: 0.5, policy_logprobs=True)
"""Half the answers wrong (by a hash of each request): groups with rewards to learn from."""

SCHEDULES: dict[str, dict[str, dict[str, Any]]] = {
    "whole": {"rollout": {"batch_size": 32}},
    "micro4": {"rollout": {"batch_size": 32}, "learner": {"micro_batch": 4}},
    "engine1": {"rollout": {"batch_size": 1, "workers": 2}},
    "stale1": {"rollout": {"batch_size": 32, "staleness": 1}},
}


def _inference(worker: FakeWorker) -> bool:
    return worker.role == Role.INFERENCE


def _learner(worker: FakeWorker) -> bool:
    return worker.role == Role.LEARNER


def _train(folder: Path, name: str, transport: FakeTransport, **sections: dict[str, Any]) -> Path:
    config = folder / f"{name}.toml"
    if not config.exists():
        write_config(folder, name, "mlx", cycles=3, **sections)
    run = folder / f"run-{name}"
    train(config, run, transport=transport)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fake-train")
    return {name: _train(folder, name, FakeTransport(SCRIPT), **sections) for name, sections in SCHEDULES.items()}


def _calls(run: Path) -> list[tuple[str, bool]]:
    """(method, answered without error) of every generate and learner_step call on record, in order."""
    with RunStore.open(run) as store:
        return [(c.call.method, c.report is not None and c.report.report.error is None) for c in store.calls()
                if c.call.method in ("generate", "learner_step")]


def test_schedules_publish_the_same_checkpoints(runs: dict[str, Path]) -> None:
    whole = published(runs["whole"])
    assert len(whole) == len(set(whole)) == 3  # every cycle published a checkpoint of its own
    for other in ("micro4", "engine1"):
        assert published(runs[other]) == whole, other
    with RunStore.open(runs["engine1"]) as store:
        meta = store.meta()
        workers = store.workers()
    assert all(len(meta[f"cycle-{n:06d}"]["generate_calls"]) == 2 for n in range(3))  # one per inference worker
    assert sorted(ident.role.value for ident in workers.values()) == ["inference", "inference", "learner"]
    # Synchronous cycles: the learner reads every sampled token as the engine did, and the core's objective agrees.
    h = history(runs["whole"])
    assert [c.staleness for c in h.cycles] == [0, 0, 0]
    assert all(c.gap.equal == c.gap.tokens > 0 for c in h.cycles)
    assert [c.loss_core for c in h.cycles] == [c.loss_core for c in history(runs["engine1"]).cycles]


def test_staleness_one_samples_the_base_model_in_cycle_one_and_differs_from_there(runs: dict[str, Path]) -> None:
    h = history(runs["stale1"])
    assert [c.staleness for c in h.cycles] == [0, 1, 1]
    stale, whole = published(runs["stale1"]), published(runs["whole"])
    assert stale[0] == whole[0]
    assert stale[1] != whole[1]
    assert h.cycles[1].policy is None  # version 0: the base model, while the learner made the first update
    assert h.cycles[1].gap.equal < h.cycles[1].gap.tokens  # sampled by another policy than the update starts from
    with RunStore.open(runs["stale1"]) as store:
        meta = store.meta()
    assert [(meta[f"cycle-{n:06d}"]["policy_version"], meta[f"cycle-{n:06d}"]["staleness"]) for n in range(3)] == [
        (0, 0), (0, 1), (1, 1)]


def test_a_run_whose_learner_is_lost_resumes_to_the_uninterrupted_checkpoints(runs: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    config = tmp_path / "whole.toml"
    write_config(tmp_path, "whole", "mlx", cycles=3, **SCHEDULES["whole"])
    run = tmp_path / "run"
    with pytest.raises(WorkerLost):
        train(config, run, transport=FakeTransport(SCRIPT, faults=[Fault("die", method="learner_step", calls=(2,),
                                                                         where=_learner)]))
    assert len(published(run)) == 1
    with RunStore.open(run) as store:
        assert not store.verify().closed
    resumed = train(config, run, transport=FakeTransport(SCRIPT))
    assert (resumed.cycles, resumed.cycles_reused) == (3, 1)
    assert published(run) == published(runs["whole"])
    # The lost update stays on record, unanswered; the cycle ran again with the same rollouts.
    assert [ok for method, ok in _calls(run) if method == "learner_step"] == [True, False, True, True]


def test_sigterm_stops_the_run_at_once_and_it_resumes_to_the_same_checkpoints(runs: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    config = tmp_path / "whole.toml"
    write_config(tmp_path, "whole", "mlx", cycles=3, **SCHEDULES["whole"])
    generated = [0]

    def report(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        generated[0] += 1
        if generated[0] == 2:  # cycle 1's rollouts: answered within the grace, no update after them
            sigterm_during_call()
        return result

    run = tmp_path / "run"
    with command_line_handlers(), pytest.raises(Stopped, match=r"^stopped at SIGTERM$") as stopped:
        train(config, run, transport=FakeTransport(Script(wrong=SCRIPT.wrong, policy_logprobs=True, report=report)))
    assert stopped.value.status == 143
    assert len(published(run)) == 1
    assert _calls(run) == [("generate", True), ("learner_step", True), ("generate", True)]  # no update after it
    resumed = train(config, run, transport=FakeTransport(SCRIPT))
    assert resumed.cycles_reused == 1
    assert published(run) == published(runs["whole"])


def test_the_next_cycles_rollouts_start_once_the_learner_reports_and_are_read_once_it_is_published(
        runs: dict[str, Path]) -> None:
    # Cycle n + 1's load_adapter and generate calls go out when cycle n's learner has reported, before the core
    # checks and publishes the checkpoint; the publication records the checkpoint they loaded.
    db = sqlite3.connect(f"file:{runs['whole'] / 'records.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT seq, kind, body FROM log ORDER BY seq").fetchall()
    finally:
        db.close()
    published_at = {key: seq for seq, kind, body in rows if kind == "meta" for key in canonical.decode(body)
                    if key.startswith("cycle-")}
    with RunStore.open(runs["whole"]) as store:
        methods = {c.seq: c.call.method for c in store.calls()}
        meta = store.meta()
    for n in range(2):
        learner = meta[f"cycle-{n:06d}"]["learner_seq"]
        assert [methods[seq] for seq in sorted(methods) if seq > learner][:2] == ["load_adapter", "generate"]
        assert meta[f"cycle-{n + 1:06d}"]["generate_seqs"][0] < published_at[f"cycle-{n:06d}"]
        assert meta[f"cycle-{n + 1:06d}"]["policy_digest"] == meta[f"cycle-{n:06d}"]["checkpoint"]["digest"]


def test_sigterm_during_an_update_publishes_it_and_starts_no_rollout_after_it(
        runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The signal comes while cycle 0's learner works: its report is taken within the grace, the cycle is checked
    # and published, and cycle 1's rollouts, which would start at that report, never do.
    config = tmp_path / "whole.toml"
    write_config(tmp_path, "whole", "mlx", cycles=3, **SCHEDULES["whole"])
    update = FakeWorker.learner_step

    def signalled_update(worker: FakeWorker, params: dict[str, Any]) -> dict[str, Any]:
        result = update(worker, params)
        sigterm_during_call()
        return result

    monkeypatch.setattr(FakeWorker, "learner_step", signalled_update)
    run = tmp_path / "run"
    with command_line_handlers(), pytest.raises(Stopped, match=r"^stopped at SIGTERM$"):
        train(config, run, transport=FakeTransport(SCRIPT))
    monkeypatch.undo()
    assert len(published(run)) == 1
    assert _calls(run) == [("generate", True), ("learner_step", True)]
    resumed = train(config, run, transport=FakeTransport(SCRIPT))
    assert resumed.cycles_reused == 1
    assert published(run) == published(runs["whole"])


def test_sigterm_during_the_last_update_finishes_the_cycle_and_closes_the_run(
        runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cycle under way at a signal is finished; when it is the last, nothing is left to resume: the run closes and
    # the outcome names the signal, instead of a stop whose resume would only close it. (The last cycle's rollouts
    # go out while cycle 1's checkpoint is checked, so a signal at them meets cycle 1 under way and stops the run.)
    config = tmp_path / "whole.toml"
    write_config(tmp_path, "whole", "mlx", cycles=3, **SCHEDULES["whole"])
    update = FakeWorker.learner_step
    updates = [0]

    def signalled_update(worker: FakeWorker, params: dict[str, Any]) -> dict[str, Any]:
        result = update(worker, params)
        updates[0] += 1
        if updates[0] == 3:  # the last cycle's update: answered within the grace
            sigterm_during_call()
        return result

    monkeypatch.setattr(FakeWorker, "learner_step", signalled_update)
    run = tmp_path / "run"
    with command_line_handlers():
        outcome = train(config, run, transport=FakeTransport(SCRIPT))
    monkeypatch.undo()
    assert updates[0] == 3
    assert outcome.signal == "SIGTERM"
    assert (outcome.cycles, outcome.cycles_reused, outcome.already_closed) == (3, 0, False)
    assert published(run) == published(runs["whole"])
    assert _calls(run) == [(method, True) for _ in range(3) for method in ("generate", "learner_step")]
    again = train(config, run, transport=FakeTransport(SCRIPT))
    assert (again.already_closed, again.head, again.signal) == (True, outcome.head, None)


def test_a_lost_inference_worker_is_replaced_and_its_call_issued_again(runs: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    transport = FakeTransport(SCRIPT, restarts=3, faults=[Fault("die", calls=(2,), where=_inference)])
    run = _train(tmp_path, "engine1", transport, **SCHEDULES["engine1"])
    assert published(run) == published(runs["engine1"])
    assert len(transport.started) == 4  # two inference workers, the learner, one replacement
    generates = [ok for method, ok in _calls(run) if method == "generate"]
    assert generates.count(False) == 1
    assert len(generates) == 2 * 3 + 1
    # Without replacements the loss stops the run as it came.
    with pytest.raises(WorkerLost):
        _train(tmp_path, "engine1-local", FakeTransport(SCRIPT, faults=[Fault("die", calls=(2,), where=_inference)]),
               **SCHEDULES["engine1"])


SHARED = {"rollout": {"batch_size": 32, "layout": "shared"}}
"""The "whole" schedule with both roles in one worker process."""


def _shared(monkeypatch: pytest.MonkeyPatch, *transports: FakeTransport) -> list[FakeSharedProcess]:
    """`train`'s shared worker processes faked: the k-th one started serves its roles with `transports[k]`."""
    made: list[FakeSharedProcess] = []
    left = list(transports)

    def start() -> FakeSharedProcess:
        made.append(FakeSharedProcess(left.pop(0)))
        return made[-1]

    monkeypatch.setattr(train_mod, "SharedProcess", start)
    return made


def _placements(run: Path) -> list[tuple[int, list[int], list[str]]]:
    """Each placement record of a run: (the pid, the pids its two workers' identities declare, their roles)."""
    with RunStore.open(run) as store:
        meta = store.meta()
        workers = store.workers()
    out = []
    for key in sorted(k for k in meta if k.startswith("placement shared ")):
        entry = meta[key]
        assert entry["layout"] == "shared"
        roles = sorted(entry["workers"])
        out.append((entry["pid"], [workers[entry["workers"][r]].pid for r in roles],
                    [workers[entry["workers"][r]].role.value for r in roles]))
    return out


def test_the_shared_layout_publishes_the_split_layouts_checkpoints(runs: dict[str, Path], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    made = _shared(monkeypatch, FakeTransport(SCRIPT))
    run = tmp_path / "run"
    train(write_config(tmp_path, "shared", "mlx", cycles=3, **SHARED), run)
    assert published(run) == published(runs["whole"])
    # The same calls as the split run, and the same objective: only where the roles ran differs.
    assert _calls(run) == _calls(runs["whole"])
    assert [c.loss_core for c in history(run).cycles] == [c.loss_core for c in history(runs["whole"]).cycles]
    # One process served both roles: its pid on record, declared by both workers, and the process closed at the end.
    (process,) = made
    assert _placements(run) == [(process.pid, [process.pid, process.pid], ["inference", "learner"])]
    assert _placements(runs["whole"]) == []
    assert process.closed


def test_a_shared_run_whose_process_is_lost_resumes_to_the_split_layouts_checkpoints(
        runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The process dies in cycle 1's update: the learner's call goes unanswered and the inference role dies with it.
    dies = FakeTransport(SCRIPT, faults=[Fault("die", method="learner_step", calls=(2,), where=_learner)])
    made = _shared(monkeypatch, dies, FakeTransport(SCRIPT))
    config = write_config(tmp_path, "shared", "mlx", cycles=3, **SHARED)
    run = tmp_path / "run"
    with pytest.raises(WorkerLost):
        train(config, run)
    assert [made[0].roles[role].poll() for role in (Role.INFERENCE, Role.LEARNER)] == [-9, -9]
    assert len(published(run)) == 1
    with RunStore.open(run) as store:
        assert not store.verify().closed
    resumed = train(config, run)
    assert (resumed.cycles, resumed.cycles_reused) == (3, 1)
    assert published(run) == published(runs["whole"])
    assert [ok for method, ok in _calls(run) if method == "learner_step"] == [True, False, True, True]
    # Each attempt's process on record, both roles in it.
    assert _placements(run) == [(p.pid, [p.pid, p.pid], ["inference", "learner"]) for p in made]


def test_a_tampered_record_is_refused_at_resume_before_any_worker_starts(tmp_path: Path) -> None:
    # The resumed run is verified in the one store opened for writing: an altered record is named in one line, no
    # worker is started, no call issued, and the records stay as they were.
    config = write_config(tmp_path, "whole", "mlx", cycles=2, **SCHEDULES["whole"])
    run = tmp_path / "run"
    with pytest.raises(WorkerLost):
        train(config, run, transport=FakeTransport(SCRIPT, faults=[Fault("die", method="learner_step", calls=(2,),
                                                                         where=_learner)]))
    db = run / "records.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    pos = data.find(b"learner_step")
    assert pos >= 0
    data[pos] ^= 0x01  # one bit of the first record that names the learner's method
    db.write_bytes(bytes(data))
    records = _record_count(db)
    resumed = FakeTransport(SCRIPT)
    with pytest.raises(train_mod.UnreadableRun) as refused:
        train(config, run, transport=resumed)
    assert re.fullmatch(r".*record \d+ \(\w+\): .*the record was altered; it cannot be resumed: restore its records, "
                        r"or choose a new run directory", str(refused.value)), refused.value
    assert "\n" not in str(refused.value)
    assert resumed.started == []
    assert _record_count(db) == records
    assert db.read_bytes() == bytes(data)  # the altered record kept as it was found, for the owner to see


def test_a_stopped_run_is_verified_once_when_it_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path, "whole", "mlx", cycles=2, **SCHEDULES["whole"])
    run = tmp_path / "run"
    with pytest.raises(WorkerLost):
        train(config, run, transport=FakeTransport(SCRIPT, faults=[Fault("die", method="learner_step", calls=(2,),
                                                                         where=_learner)]))
    verified: list[bool] = []  # whether each verification was of a store opened for writing
    verify = RunStore.verify

    def counted(store: RunStore, **kwargs: Any) -> Any:
        verified.append(store._writable)
        return verify(store, **kwargs)

    monkeypatch.setattr(RunStore, "verify", counted)
    resumed = train(config, run, transport=FakeTransport(SCRIPT))
    assert (resumed.cycles, resumed.cycles_reused) == (2, 1)
    assert verified == [True]  # was twice: read-only, then again in the store opened for writing
    verified.clear()
    assert train(config, run, transport=FakeTransport(SCRIPT)).already_closed
    assert verified == [False]  # a closed run: only verified, never opened for writing


def _record_count(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return int(conn.execute("SELECT count(*) FROM log").fetchone()[0])
