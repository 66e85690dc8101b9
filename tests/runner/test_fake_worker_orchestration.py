"""`use run`'s orchestration against in-process fake workers (tests/support/fake_worker.py): a resumed run
re-issues only the planned calls without a successful record and reaches the uninterrupted run's records and
decision; no call precedes every worker's identity check; each call runs the plan's batch schedule; a sequential
contract stops early and a run killed mid-look resumes to the same stop; a lost worker is replaced and its call
issued again, a bounded number of times. The fakes speak the real protocol and their calls are recorded by the real
store, so every claim here is about the core; what real engines answer is for the `engine` tests."""

from __future__ import annotations

import _thread
import gc
import re
import shutil
import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from contract.contract_runs import Workspace, make_workspace
from support.fake_worker import ENGINE_VERSION, FakeTransport, FakeWorker, Fault, Script
from support.signals import command_line_handlers, sigterm_during_call
from support.use_runs import decision_figures as _figures
from support.use_runs import outputs_by_call as _outputs_by_call

from invar import canonical
from invar.contract.admit import Step, admit
from invar.contract.bind import SEQUENTIAL_META
from invar.contract.decide import Answer
from invar.contract.reading import RunReader
from invar.errors import EvidenceError, ProtocolError, WorkerError
from invar.interrupts import Stopped
from invar.records import RunStore
from invar.runner import use_run as use_run_module
from invar.runner.use_run import RunOutcome, calls_at_once_for, use_run
from invar.transport import WorkerLost

UNITS = 32
PER_CALL = 8


def _workspace(root: Path, **changes: Any) -> Workspace:
    """The contract_runs declaration over fake workers: both packages report the fake engine's versions, the
    candidate (nf4) has no patch; four calls of 8 requests per package and layout (solo, b4r)."""
    candidate = {"engine_version": ENGINE_VERSION, "patches": None, **changes.pop("candidate", {})}
    reference = {"engine_version": ENGINE_VERSION, **changes.pop("reference", {})}
    return make_workspace(root, units=changes.pop("units", UNITS), reference=reference,
                          candidate=candidate, execution={"requests_per_call": PER_CALL}, **changes)


def _candidate(worker: FakeWorker) -> bool:
    return worker.package == "candidate"


# A candidate that answers a quarter of the prompts wrong: the decision has losses to get right.
SCRIPT = Script(wrong=lambda w: 0.25 if w.package == "candidate" else 0.0)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return _workspace(tmp_path_factory.mktemp("fake-run"))


@pytest.fixture(scope="module")
def baseline(ws: Workspace) -> Path:
    run = ws.root / "baseline"
    outcome = use_run(ws.contract_path, run, transport=FakeTransport(SCRIPT))
    assert (outcome.calls_total, outcome.calls_issued, outcome.calls_reused) == (len(ws.plan.calls),) * 2 + (0,)
    return run






def _generate_calls(run: Path) -> list[tuple[str, str, bool]]:
    """(package, params digest, answered without error) of every generate call on record, in order. The package
    is told by the quantization its worker loaded (the two packages' calls may have the same params)."""
    with RunStore.open(run) as store:
        calls = store.calls()
    package = {c.worker: "candidate" if c.call.params["quantization"] == "nf4" else "reference"
               for c in calls if c.call.method == "load_model"}
    return [(package[c.worker], canonical.digest(c.call.params),
             c.report is not None and c.report.report.error is None)
            for c in calls if c.call.method == "generate"]


def test_a_run_of_fake_workers_is_the_plan_and_is_decided(ws: Workspace, baseline: Path) -> None:
    decision = admit(ws.contract_path, baseline)
    assert len(decision.evidence) == len(ws.plan.calls)
    # A quarter of the candidate's answers are wrong and none of the reference's: the losses reach the decision.
    assert decision.task_loss.n == UNITS
    assert decision.task_loss.worse > 0
    assert decision.task_loss.better == 0
    with RunStore.open(baseline) as store:
        assert store.verify().closed
        assert len(store.workers()) == 2
    # Running it again on a closed run issues nothing.
    again = use_run(ws.contract_path, baseline, transport=(fresh := FakeTransport(SCRIPT)))
    assert again.already_closed
    assert fresh.started == []


def test_admission_releases_the_plan_and_its_units_before_it_decides(ws: Workspace, baseline: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # What admission holds while it decides (and imports what its bounds need) must not grow with the population's
    # text: the plan, its units and the population are gone by then; only losses and their records are kept
    # (bench/run_memory.py measures the peak).
    read = RunReader.of_run
    held: list[tuple[weakref.ref[Any], ...]] = []

    def of_run(*args: Any) -> RunReader:
        reader = read(*args)
        held.append((weakref.ref(reader), weakref.ref(reader.plan)))  # the plan holds every unit and its source
        return reader

    monkeypatch.setattr(RunReader, "of_run", staticmethod(of_run))
    alive_when_deciding: list[bool] = []

    def progress(step: Step) -> None:
        if step.phase == "deciding":
            gc.collect()
            alive_when_deciding.extend(ref() is not None for ref in held[0])

    decision = admit(ws.contract_path, baseline, progress=progress)
    assert alive_when_deciding == [False, False]
    assert decision.output() == admit(ws.contract_path, baseline).output()


def test_each_call_runs_its_planned_batch_schedule(ws: Workspace, tmp_path: Path) -> None:
    transport = FakeTransport(SCRIPT)
    use_run(ws.contract_path, tmp_path / "run", transport=transport)
    planned = Counter((c.package, canonical.digest(c.params.to_wire()["layout"])) for c in ws.plan.calls)
    received = Counter((package, canonical.digest(layout)) for package, layout in transport.layouts)
    assert received == planned
    assert {len(batch) for _, layout in transport.layouts for batch in layout} == {1, 4}  # solo and b4r
    # Each call on record is a planned call's exact params (requests in the plan's order: b4r reversed), once.
    assert Counter((p, d) for p, d, _ in _generate_calls(tmp_path / "run")) == \
        Counter((c.package, canonical.digest(c.params.to_wire())) for c in ws.plan.calls)


def test_a_batch_dependent_candidate_fails_the_invariance_layouts(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = Script(batch_dependent=_candidate)
    use_run(ws.contract_path, tmp_path / "run", transport=FakeTransport(script))
    d = admit(ws.contract_path, tmp_path / "run").output().model_dump(mode="json", exclude_unset=True)
    assert d["answer"] != "Admitted"
    assert "b4r" in str(d["invariance"])
    # The same contract with an engine whose samples do not depend on their batch passes them.
    use_run(ws.contract_path, tmp_path / "steady", transport=FakeTransport())
    steady = admit(ws.contract_path, tmp_path / "steady")
    assert steady.output().model_dump(mode="json", exclude_unset=True)["invariance"] != d["invariance"]


@pytest.mark.parametrize("fault", ["die", "error", "hang"])
def test_a_run_stopped_mid_plan_resumes_to_the_uninterrupted_records_and_decision(
        ws: Workspace, baseline: Path, tmp_path: Path, fault: str) -> None:
    run = tmp_path / "run"
    broken = FakeTransport(SCRIPT, faults=[Fault(fault, calls=(3,), where=_candidate)])  # type: ignore[arg-type]
    expected = {"die": WorkerLost, "error": WorkerError, "hang": ProtocolError}[fault]
    with pytest.raises(expected):
        use_run(ws.contract_path, run, transport=broken, call_timeout=0.5 if fault == "hang" else 30.0)
    with RunStore.open(run) as store:
        assert not store.verify().closed
    before = _generate_calls(run)
    answered = {(package, digest) for package, digest, ok in before if ok}
    assert len(answered) == sum(ok for *_, ok in before)  # no planned call answered twice
    assert 2 <= len(answered) < len(ws.plan.calls)
    assert len(before) > len(answered)  # the stopped call is on record, without a successful report

    healthy = FakeTransport(SCRIPT)
    resumed = use_run(ws.contract_path, run, transport=healthy)
    assert resumed.calls_reused == len(answered)
    assert resumed.calls_issued == len(ws.plan.calls) - len(answered)
    # Only the planned calls without a successful record went out again, each once.
    again = [(package, digest) for package, digest, _ in _generate_calls(run)[len(before):]]
    assert len(again) == len(set(again)) == resumed.calls_issued
    assert not set(again) & answered
    assert sum(1 for _, method in healthy.received if method == "generate") == resumed.calls_issued
    assert _figures(run, ws.contract_path) == _figures(baseline, ws.contract_path)
    assert _outputs_by_call(run, ws.contract_path) == _outputs_by_call(baseline, ws.contract_path)


def test_a_resumed_run_keeps_the_inputs_its_first_attempt_did_not(ws: Workspace, baseline: Path,
                                                                   tmp_path: Path) -> None:
    """A run created but stopped before its inputs were kept (the first write after the store's creation failed)
    gains them on resume: it records exactly the meta an uninterrupted run does."""
    run = tmp_path / "run"
    with RunStore.open(baseline) as done:
        kept = done.meta()
    RunStore.create(run, meta=kept["run"]).close()  # what `use run` writes before it keeps the inputs
    assert "inputs" not in kept["run"]
    use_run(ws.contract_path, run, transport=FakeTransport(SCRIPT))
    with RunStore.open(run) as store:
        meta = store.meta()
    assert meta["inputs"] == kept["inputs"]
    assert set(meta) == set(kept)
    assert _figures(run, ws.contract_path) == _figures(baseline, ws.contract_path)


def test_sigterm_stops_issuing_calls_keeps_the_answers_and_the_run_resumes_to_the_same_decision(
        ws: Workspace, baseline: Path, tmp_path: Path) -> None:
    # The command line's handler turns SIGTERM into `Terminated` in the main thread, as at a scheduler's stop.
    calls = [0]

    def report(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        calls[0] += 1
        if calls[0] == 3:
            sigterm_during_call()
        return result

    run = tmp_path / "run"
    with command_line_handlers(), \
            pytest.raises(Stopped, match=r"^stopped issuing calls at SIGTERM after [0-9]+ answered call") as stopped:
        use_run(ws.contract_path, run, transport=FakeTransport(Script(wrong=SCRIPT.wrong, report=report)))
    assert stopped.value.status == 143
    answered = [ok for *_, ok in _generate_calls(run)]
    assert 3 <= len(answered) < len(ws.plan.calls)
    assert all(answered)  # the calls under way answered within the grace
    resumed = use_run(ws.contract_path, run, transport=FakeTransport(SCRIPT))
    assert resumed.calls_reused == len(answered)
    assert _figures(run, ws.contract_path) == _figures(baseline, ws.contract_path)


def test_ctrl_c_while_a_model_loads_stops_at_once(ws: Workspace, tmp_path: Path) -> None:
    # A load has no answer worth the grace: the worker still loading is stopped at the signal, not after its load.
    load_s = 60.0
    transport = FakeTransport(Script(wrong=SCRIPT.wrong, load_seconds=lambda number: load_s if number == 2 else 0))

    def interrupt() -> None:
        deadline = time.monotonic() + 30
        while sum(1 for _, method in transport.received if method == "load_model") < 2 and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(Stopped, match=r"^stopped issuing calls at Ctrl-C after 0 answered call") as stopped:
        use_run(ws.contract_path, tmp_path / "run", transport=transport)
    assert time.monotonic() - started < load_s / 2
    assert stopped.value.status == 130
    assert [method for _, method in transport.received] == ["load_model", "load_model"]


def test_no_call_is_made_before_every_worker_shows_the_contracts_identity(tmp_path: Path) -> None:
    ws = _workspace(tmp_path, candidate={"engine_version": {"invar-fake-engine": "2"}})
    transport = FakeTransport()
    with pytest.raises(EvidenceError, match=re.escape("the candidate worker is not the package the contract names: "
                                                      "candidate.engine_version")):
        use_run(ws.contract_path, tmp_path / "run", transport=transport)
    assert len(transport.started) == 2
    assert transport.received == []  # the reference, whose identity is right, was sent nothing either
    with RunStore.open(tmp_path / "run") as store:
        assert store.calls() == []
        assert len(store.workers()) == 2  # both identities are on record, the refused one too


def test_a_worker_that_refuses_to_start_stops_the_run_before_any_call(ws: Workspace, tmp_path: Path) -> None:
    transport = FakeTransport(refuse=lambda number, argv: "--threads 1: not on this machine" if number == 2 else None)
    refused = "hf-inference: the worker refused to start: invar.workers.hf_worker: --threads 1: not on this machine"
    with pytest.raises(ProtocolError, match=f"^{re.escape(refused)}$"):
        use_run(ws.contract_path, tmp_path / "run", transport=transport)
    assert transport.received == []


def test_a_lost_worker_is_replaced_and_its_call_issued_again(ws: Workspace, baseline: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    transport = FakeTransport(SCRIPT, restarts=3, faults=[Fault("die", calls=(2, 5), where=_candidate)])
    outcome = use_run(ws.contract_path, run, transport=transport)
    assert outcome.calls_issued == len(ws.plan.calls)
    assert len(transport.started) == 4  # the reference, the candidate and its two replacements
    calls = _generate_calls(run)
    assert len(calls) == len(ws.plan.calls) + 2
    lost = [(package, digest) for package, digest, ok in calls if not ok]
    assert len(lost) == 2
    assert {p for p, _ in lost} == {"candidate"}
    for key in lost:  # answered once, by a replacement, after the loss
        assert [ok for p, d, ok in calls if (p, d) == key] == [False, True]
    with RunStore.open(run) as store:
        assert len(store.workers()) == 4  # each replacement's identity is checked and on record
    assert _figures(run, ws.contract_path) == _figures(baseline, ws.contract_path)
    assert _outputs_by_call(run, ws.contract_path) == _outputs_by_call(baseline, ws.contract_path)


def test_a_worker_lost_more_often_than_it_may_be_replaced_stops_the_run(ws: Workspace, tmp_path: Path) -> None:
    transport = FakeTransport(SCRIPT, restarts=2, faults=[Fault("die", calls=range(1, 100), where=_candidate)])
    with pytest.raises(ProtocolError, match=r"^the candidate worker 1 was lost 3 times \(replaced 2 times\); last: "):
        use_run(ws.contract_path, tmp_path / "run", transport=transport)
    assert len([w for w in transport.started if w.package == "candidate"]) == 3
    # Without replacements (local workers) the first loss stops the run as it came.
    local = FakeTransport(SCRIPT, faults=[Fault("die", calls=(1,), where=_candidate)])
    with pytest.raises(WorkerLost, match="worker exited"):
        use_run(ws.contract_path, tmp_path / "local", transport=local)
    assert len(local.started) == 2


def _sequential(root: Path, epsilon: str) -> Workspace:
    """Three looks of 16 units (one call per package and look), no invariance layouts."""
    return make_workspace(
        root, units=48, reference={"engine_version": ENGINE_VERSION},
        candidate={"engine_version": ENGINE_VERSION, "patches": None},
        requirement={"standard": "population", "epsilon": epsilon, "confidence": "0.95",
                     "method": "paired-binary-sequence", "sequential": True, "max_n": 48},
        pairing={"layout": "b16"}, layouts={"b16": {"batch_size": 16}}, invariance={"required": False, "layouts": None},
        execution={"requests_per_call": 16}, premises=[])


def _stop(outcome: RunOutcome) -> tuple[Any, ...]:
    assert outcome.stop is not None
    return outcome.stop["answer"], outcome.stop["look"], outcome.stop["units"]


def test_a_sequential_run_stops_early_and_a_run_lost_mid_look_resumes_to_the_same_stop(tmp_path: Path) -> None:
    # Identical packages: every d is 0, so the bound after 16 units (0.295) is above ε = 0.2, after 32 below it.
    ws = _sequential(tmp_path / "ws", "0.2")
    transport = FakeTransport()
    outcome = use_run(ws.contract_path, tmp_path / "run", transport=transport)
    assert _stop(outcome) == ("Admitted", 2, 32)
    assert outcome.calls_issued == 4  # look 3 never ran
    assert len(transport.layouts) == 4
    decision = admit(ws.contract_path, tmp_path / "run", expect_head=outcome.head)
    assert decision.answer is Answer.ADMITTED
    assert decision.task_loss.n == 32

    # The candidate's worker is lost on its look-2 call, after the reference's may have been answered.
    killed = tmp_path / "killed"
    with pytest.raises(WorkerLost):
        use_run(ws.contract_path, killed, transport=FakeTransport(faults=[Fault("die", calls=(2,),
                                                                                where=_candidate)]))
    with RunStore.open(killed) as store:
        assert not store.closed
        assert SEQUENTIAL_META not in store.meta()
    answered = sum(ok for *_, ok in _generate_calls(killed))
    assert answered in (2, 3)
    resumed = use_run(ws.contract_path, killed, transport=FakeTransport())
    assert resumed.calls_issued == 4 - answered
    assert _stop(resumed) == _stop(outcome)
    again = admit(ws.contract_path, killed, expect_head=resumed.head)
    assert (again.answer, again.reason, again.task_loss) == (decision.answer, decision.reason, decision.task_loss)


def test_a_broken_candidate_stops_violated_at_the_first_look(tmp_path: Path) -> None:
    ws = _sequential(tmp_path / "ws", "0.2")
    broken = FakeTransport(Script(wrong=lambda w: 1.0 if w.package == "candidate" else 0.0))
    outcome = use_run(ws.contract_path, tmp_path / "run", transport=broken)
    assert _stop(outcome) == ("Violated", 1, 16)
    assert outcome.calls_issued == 2
    decision = admit(ws.contract_path, tmp_path / "run", expect_head=outcome.head)
    assert decision.answer is Answer.VIOLATED
    assert decision.task_loss.worse == 16


def test_the_fake_workers_stop_with_the_run(ws: Workspace, tmp_path: Path) -> None:
    transport = FakeTransport(SCRIPT)
    use_run(ws.contract_path, tmp_path / "run", transport=transport)
    assert [w.process.returncode for w in transport.started] == [0, 0]  # shut down cleanly, not killed
    shutil.rmtree(tmp_path / "run")


def test_a_report_naming_another_model_stops_the_run_on_receipt_and_is_kept(ws: Workspace, tmp_path: Path) -> None:
    """`use run` checks each report as admission will (`check_package_report`): a candidate whose third generate
    report names another model stops the run at once, with admission's words, and the report stays on record."""
    seen: Counter[int] = Counter()

    def report(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        if worker.package == "candidate" and method == "generate":
            seen[worker.number] += 1
            if seen[worker.number] == 3:
                return {**result, "model_digest": "e" * 64}
        return result

    run = tmp_path / "run"
    with pytest.raises(EvidenceError, match=r"candidate call .*: its report names model eeeeeeeeeeeeeeee… "
                                            r"adapter None…, not the candidate's model"):
        use_run(ws.contract_path, run, transport=FakeTransport(Script(report=report)))
    with RunStore.open(run) as store:
        named = [c.report.report.result["model_digest"] for c in store.calls()
                 if c.call.method == "generate" and c.report is not None and c.report.report.result is not None]
    assert named.count("e" * 64) == 1  # the report that stopped the run is on record, as received


class _InFlight:
    """How many calls the fake engines compute at once: a report hook that holds each call a moment, and holds the
    first call until a second one is computing too (at most 2 s), so that calls free to overlap do overlap."""

    def __init__(self) -> None:
        self.lock, self.now, self.most = threading.Lock(), 0, 0
        self.first = threading.Event()

    def report(self, worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            first = not self.first.is_set()
            self.first.set()
        deadline = time.monotonic() + (2.0 if first else 0.02)
        while time.monotonic() < deadline and not (first and self.most > 1):
            time.sleep(0.005)
        with self.lock:
            self.now -= 1
        return result


def test_a_package_s_calls_wait_for_all_its_workers_to_load_so_a_slow_load_still_gets_calls(
        ws: Workspace, baseline: Path, tmp_path: Path) -> None:
    """Two workers per package, the last one started loading for a second (fake calls take milliseconds): had
    calls gone out as each worker loaded, its package's other worker would have taken them all."""
    script = Script(wrong=SCRIPT.wrong, load_seconds=lambda number: 1.0 if number == 4 else 0.0)
    transport = FakeTransport(script)
    run = tmp_path / "run"
    use_run(ws.contract_path, run, transport=transport, workers=2)
    assert {number for number, method in transport.received if method == "generate"} == {1, 2, 3, 4}
    assert _figures(run, ws.contract_path) == _figures(baseline, ws.contract_path)


@pytest.mark.parametrize("calls_at_once", [None, 1])
def test_calls_at_once_bounds_the_calls_computing_together_and_changes_no_record(
        ws: Workspace, baseline: Path, tmp_path: Path, calls_at_once: int | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(use_run_module, "cores", lambda: 2)  # both one-thread HF workers fit
    seen = _InFlight()
    script = Script(wrong=SCRIPT.wrong, report=seen.report)
    run = tmp_path / "run"
    use_run(ws.contract_path, run, transport=FakeTransport(script), calls_at_once=calls_at_once)
    # Two workers, one per package: without a bound their calls overlap; with --calls-at-once 1 none does.
    assert seen.most == (2 if calls_at_once is None else 1)
    assert sorted(_generate_calls(run)) == sorted(_generate_calls(baseline))
    assert _figures(run, ws.contract_path) == _figures(baseline, ws.contract_path)


def test_by_default_no_more_calls_compute_at_once_than_the_cores_hold(
        tmp_path: Path, baseline: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both packages' HF workers compute on 2 threads; on 2 cores they take turns, and the start-up says why.
    two = _workspace(tmp_path / "ws", reference={"settings": {"device": "cpu", "threads": 2}},
                     candidate={"settings": {"device": "cpu", "threads": 2}})
    monkeypatch.setattr(use_run_module, "cores", lambda: 2)
    seen, phases = _InFlight(), []
    run = tmp_path / "run"
    use_run(two.contract_path, run, transport=FakeTransport(Script(wrong=SCRIPT.wrong, report=seen.report)),
            phase=phases.append)
    assert seen.most == 1
    assert any("one call at a time: a hf call computes on 2 of 2 cores" in p for p in phases), phases
    assert _figures(run, two.contract_path) == _figures(baseline, ws.contract_path)
    # Four cores hold both; an explicit --calls-at-once is what the user asked for, whatever the cores.
    monkeypatch.setattr(use_run_module, "cores", lambda: 4)
    seen = _InFlight()
    use_run(two.contract_path, tmp_path / "run4", transport=FakeTransport(Script(wrong=SCRIPT.wrong,
                                                                                 report=seen.report)))
    assert seen.most == 2
    monkeypatch.setattr(use_run_module, "cores", lambda: 2)
    seen = _InFlight()
    use_run(two.contract_path, tmp_path / "run2", calls_at_once=2,
            transport=FakeTransport(Script(wrong=SCRIPT.wrong, report=seen.report)))
    assert seen.most == 2


def test_the_cores_a_call_uses_come_from_the_engine_table() -> None:
    from invar.engines import Engine
    from invar.runner.engine import EngineSpec

    def spec(engine: str, **settings: Any) -> EngineSpec:
        return EngineSpec(Engine(engine), Path("m"), settings=settings)

    vllm_cpu, hf1 = spec("vllm", device="cpu"), spec("hf", device="cpu", threads=1)
    both = {"reference": 1, "candidate": 1}
    # Two vLLM CPU engines on 2 cores, or one beside an HF worker: one call at a time.
    assert calls_at_once_for({"reference": vllm_cpu, "candidate": vllm_cpu}, both, 2) == (
        1, "a vllm call computes on 2 of 2 cores")
    assert calls_at_once_for({"reference": hf1, "candidate": vllm_cpu}, both, 16) == (
        1, "a vllm call computes on 16 of 16 cores")
    # One-thread HF workers: as many at once as there are cores.
    assert calls_at_once_for({"reference": hf1, "candidate": hf1}, both, 2) is None
    assert calls_at_once_for({"reference": hf1, "candidate": hf1}, {"reference": 3, "candidate": 3}, 4) == (
        4, "a hf call computes on 1 of 4 cores")
    # Computing elsewhere (a GPU, a server) or unknown (MLX): not held back.
    gpu = {"reference": spec("vllm", device="cuda"), "candidate": spec("hf", device="cuda", threads=1)}
    assert calls_at_once_for(gpu, both, 2) is None
    assert calls_at_once_for({"reference": hf1, "candidate": spec("mlx", device="Device(cpu, 0)")}, both, 2) is None
    assert calls_at_once_for({"reference": spec("openai"), "candidate": spec("openai")}, both, 1) is None
    # A package with no calls left starts no worker and holds nothing back.
    assert calls_at_once_for({"reference": vllm_cpu, "candidate": vllm_cpu}, {"reference": 0, "candidate": 1},
                             2) is None


@pytest.mark.parametrize("bad", [0, -1, True])
def test_calls_at_once_below_one_is_refused_before_anything_starts(ws: Workspace, tmp_path: Path, bad: Any) -> None:
    transport = FakeTransport(SCRIPT)
    with pytest.raises(Exception, match="--calls-at-once"):
        use_run(ws.contract_path, tmp_path / "run", transport=transport, calls_at_once=bad)
    assert transport.started == []
    assert not (tmp_path / "run").exists()
