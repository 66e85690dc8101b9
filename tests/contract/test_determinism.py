"""The determinism requirement (`[determinism]`): the candidate runs one layout again, in a worker started afresh, and
must reproduce every unit's tokens and log-probabilities bit for bit; relative to the reference, a unit the reference
itself does not reproduce is not counted. Runs are written through the record store as workers' calls and reports (no
mocks); a contract without the section keeps its bytes and its plan."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from contract_runs import CANDIDATE_IDENTITY, REFERENCE_IDENTITY, RunWriter, Workspace, make_workspace, unit_ids
from support.fake_worker import ENGINE_VERSION, FakeTransport

from invar.contract.admit import admit
from invar.contract.decide import Answer
from invar.contract.receipt import receipt_body
from invar.errors import ContractError, EvidenceError
from invar.records import RunStore
from invar.runner.use_run import use_run

N = 600  # enough units for the task bound to admit at ε = 0.05 when both packages answer alike

NO_INVARIANCE = {"invariance": {"required": False, "layouts": []}, "layouts": {"solo": {"batch_size": 1}}}
DETERMINISM = {"required": True, "layout": "solo", "runs": 2, "relative_to": "reference"}


@pytest.fixture(scope="module")
def determinism(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("determinism"), units=N, determinism=DETERMINISM, **NO_INVARIANCE)


def _flip(ids: Iterable[str]) -> Any:
    """An output edit that flips the last bit of the first log-probability of the units `ids`."""
    chosen = set(ids)

    def edit(outputs: list[dict[str, Any]]) -> None:
        for o in outputs:
            if o["request_id"] in chosen:
                o["logprobs"] = o["logprobs"].copy()
                o["logprobs"].view(np.uint32)[0] ^= 1

    return edit


def _run(ws: Workspace, run_dir: Path, varies: dict[str, Iterable[str]], *, fresh: bool = True) -> Path:
    """Every planned call answered; in a later run the units `varies[package]` of that package get other
    log-probability bits than in the first. Later runs go to workers started afresh (`fresh`), as `use run` does."""
    writer = RunWriter(ws, run_dir)
    first = {"reference": writer.worker("reference"), "candidate": writer.worker("candidate")}
    again = {"reference": writer.worker("reference", {**REFERENCE_IDENTITY, "pid": 303}),
             "candidate": writer.worker("candidate", {**CANDIDATE_IDENTITY, "pid": 404})} if fresh else first
    for planned in ws.plan.calls:
        worker = (first if planned.run == 1 else again)[planned.package]
        changed = varies.get(planned.package, ()) if planned.run > 1 else ()
        writer.generate(worker, planned, edit_outputs=_flip(changed))
    return writer.close()


def test_the_layout_runs_again_after_every_other_call(determinism: Workspace) -> None:
    plan = determinism.plan
    assert [c.key for c in plan.calls] == ["reference/solo#0", "candidate/solo#0", "candidate/solo@2#0",
                                           "reference/solo@2#0"]
    again = plan.calls[2]
    assert (again.run, again.purposes, again.params_digest) == (2, ("determinism",), plan.calls[1].params_digest)
    assert plan.layout_calls("candidate", "solo") == (plan.calls[1],)  # the first run is the layout's own calls
    assert b'"determinism":{"layout":"solo","relative_to":"reference","required":true,"runs":2}' in \
        determinism.contract.canonical_json()


def test_a_contract_without_it_keeps_its_bytes_and_plan(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=20, **NO_INVARIANCE)
    assert b"determinism" not in ws.contract.canonical_json()
    assert [c.key for c in ws.plan.calls] == ["reference/solo#0", "candidate/solo#0"]
    d = admit(ws.contract_path, _run(ws, tmp_path / "run", {}))
    assert "determinism" not in d.output().model_dump(mode="json", exclude_unset=True)
    assert "determinism" not in receipt_body(d)["figures"]


def test_reproduced_outputs_are_admitted(determinism: Workspace, tmp_path: Path) -> None:
    d = admit(determinism.contract_path, _run(determinism, tmp_path / "run", {}))
    assert d.answer is Answer.ADMITTED, d.reason
    out = d.output().model_dump(mode="json", exclude_unset=True)["determinism"]
    assert (out["holds"], out["units"], out["units_differing"], out["reference_units_differing"]) == (True, N, 0, 0)
    assert receipt_body(d)["figures"]["determinism"]["holds"] is True


def test_outputs_that_change_between_runs_are_violated_naming_the_units(determinism: Workspace,
                                                                        tmp_path: Path) -> None:
    ref_varies = unit_ids(determinism, 20, 10)
    changed = unit_ids(determinism, 3, 200)
    run = _run(determinism, tmp_path / "run", {"reference": ref_varies, "candidate": [*ref_varies[:5], *changed]})
    d = admit(determinism.contract_path, run)
    assert d.answer is Answer.VIOLATED
    assert d.reason.startswith(f"determinism: 3 of {N} units differ between 2 runs of layout solo under the "
                               "candidate (20 differ between the reference's runs too and are not counted); "
                               f"unit {changed[0]}: log-probabilities differ at position 0"), d.reason
    assert "between runs 1 and 2 of layout solo; the reference reproduces it" in d.reason
    out = d.output().model_dump(mode="json", exclude_unset=True)["determinism"]
    assert (out["units_differing"], out["candidate_units_differing"], out["differing_units"]) == (3, 8, changed)
    figures = receipt_body(d)["figures"]["determinism"]
    assert (figures["differing_units"], figures["reference_units_differing"]) == (changed, 20)


def test_without_relative_to_every_unit_counts(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=40, determinism={"required": True, "layout": "solo"}, **NO_INVARIANCE)
    assert [c.key for c in ws.plan.calls] == ["reference/solo#0", "candidate/solo#0", "candidate/solo@2#0"]
    d = admit(ws.contract_path, _run(ws, tmp_path / "run", {"candidate": unit_ids(ws, 2)}))
    assert d.answer is Answer.VIOLATED
    assert d.reason.startswith("determinism: 2 of 40 units differ between 2 runs of layout solo under the candidate; ")


def test_a_later_run_in_the_same_worker_is_refused(determinism: Workspace, tmp_path: Path) -> None:
    # Whatever a process kept from the first run (a cache) could answer the second: the records must show a fresh one.
    with pytest.raises(EvidenceError, match=r"answers planned call candidate/solo@2#0, a run again of candidate/"
                                            r"solo#0, from the worker that answered that call .* determinism needs a "
                                            r"worker started afresh"):
        admit(determinism.contract_path, _run(determinism, tmp_path / "run", {}, fresh=False))


def test_a_missing_later_run_is_refused(determinism: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(determinism, tmp_path / "run")
    workers = {"reference": writer.worker("reference"), "candidate": writer.worker("candidate")}
    for planned in determinism.plan.calls[:2]:
        writer.generate(workers[planned.package], planned)
    with pytest.raises(EvidenceError, match=r"planned call candidate/solo@2#0 \(generate, 600 requests\) has no "
                                            r"successful record"):
        admit(determinism.contract_path, writer.close())


@pytest.mark.parametrize(("section", "says"), [
    ({"required": True, "runs": 2}, "determinism.layout: name the layout run again"),
    ({"required": True, "layout": "b4r"}, "determinism.layout: 'b4r' is not a layout the candidate runs"),
    ({"required": False, "layout": "solo"}, "determinism: determinism is not required"),
    ({"required": True, "layout": "solo", "runs": 1}, "determinism.runs"),
])
def test_bad_sections_are_one_line(tmp_path: Path, section: dict[str, Any], says: str) -> None:
    layouts = {"solo": {"batch_size": 1}, "b4r": {"batch_size": 4, "order": "reverse"}} \
        if section.get("layout") == "b4r" else {"solo": {"batch_size": 1}}
    with pytest.raises(ContractError) as caught:
        make_workspace(tmp_path, units=20, determinism=section, invariance={"required": False, "layouts": []},
                       layouts=layouts)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_use_run_runs_each_later_run_in_fresh_workers(tmp_path: Path) -> None:
    # The in-process fake worker (deterministic): use run issues the later runs after every other call, over workers
    # started for them, and admission accepts the records as they are.
    ws = make_workspace(tmp_path, units=24, reference={"engine_version": ENGINE_VERSION},
                        candidate={"engine_version": ENGINE_VERSION, "patches": None},
                        execution={"requests_per_call": 8}, determinism=DETERMINISM, **NO_INVARIANCE)
    outcome = use_run(ws.contract_path, tmp_path / "run", transport=FakeTransport())
    assert outcome.calls_issued == 12  # 3 calls per package and run
    with RunStore.open(tmp_path / "run") as store:
        calls = [(rec.worker, rec.call.params["requests"][0]["request_id"]) for rec in store.iter_calls()
                 if rec.call.method == "generate"]
    assert len({worker for worker, _ in calls[:6]} & {worker for worker, _ in calls[6:]}) == 0
    d = admit(ws.contract_path, tmp_path / "run")
    # Determinism holds, so the task bound decides (24 units cannot admit at ε = 0.05).
    assert d.reason.startswith("the bound "), d.reason
    assert d.determinism is not None
    assert (d.determinism.holds, d.determinism.candidate_units_differing) == (True, 0)
