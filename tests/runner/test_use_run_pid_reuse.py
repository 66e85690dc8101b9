"""A resumed `use run` whose workers get the pids of the first attempt's (a container restarts its pid numbering, a
busy host reuses them) keeps one record key per worker: every worker identity names the start it came from, so the
calls of the two attempts, each numbered from 1, never share a key (issue 51: the run was left unreadable, "call id 1
is used twice for one worker")."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from contract.contract_runs import make_workspace
from support import fake_worker
from support.fake_worker import ENGINE_VERSION, FakeTransport, Fault

from invar.contract.admit import admit
from invar.records import RunStore
from invar.runner.use_run import use_run
from invar.transport import WorkerLost


def test_workers_with_the_pids_of_the_first_attempt_keep_the_resumed_run_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_workspace(tmp_path, units=16, reference={"engine_version": ENGINE_VERSION},
                        candidate={"engine_version": ENGINE_VERSION, "patches": None},
                        execution={"requests_per_call": 8})
    run = tmp_path / "run"
    monkeypatch.setattr(fake_worker, "_PIDS", itertools.count(4000))
    with pytest.raises(WorkerLost):
        use_run(ws.contract_path, run, transport=FakeTransport(faults=[Fault("die", calls=(3,))]))
    monkeypatch.setattr(fake_worker, "_PIDS", itertools.count(4000))  # the same pids again
    resumed = use_run(ws.contract_path, run, transport=FakeTransport())
    assert resumed.calls_reused >= 1
    with RunStore.open(run) as store:
        assert store.verify().closed
        workers = store.workers()
        # The first attempt may stop before its second worker is on record, so 3 or 4 starts: what matters is that a
        # pid started twice is on record under two keys.
        pids = [ident.pid for ident in workers.values()]
        assert len(workers) in (3, 4)
        assert set(pids) <= {4000, 4001}
        assert len(pids) > len(set(pids))
    # Admission reads every record: the resumed run decides as an uninterrupted one does.
    use_run(ws.contract_path, tmp_path / "whole", transport=FakeTransport())
    assert admit(ws.contract_path, run).answer == admit(ws.contract_path, tmp_path / "whole").answer
