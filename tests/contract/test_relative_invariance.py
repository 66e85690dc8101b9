"""Invariance relative to the reference (`invariance.relative_to = "reference"`): the reference runs the same
layouts, and the candidate is Violated only where it adds layout dependence the reference lacks, unit by unit.
Runs are written through the record store as workers' calls and reports (no mocks); a contract without the key
keeps its bytes, its plan and its decision's JSON."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from contract_runs import CANDIDATE_IDENTITY, RunWriter, Workspace, make_workspace, unit_ids

from invar.contract.admit import admit
from invar.contract.decide import Answer
from invar.contract.receipt import receipt_body
from invar.errors import ContractError

N = 600  # enough units for the task bound to admit at ε = 0.05 when both packages answer alike

RELATIVE = {"required": True, "layouts": ["solo", "b4r"], "relative_to": "reference"}
# The candidate differs from the reference by its weights' quantization, with no patch folder to resolve.
UNPATCHED = {"patches": None}
IDENTITY = {**CANDIDATE_IDENTITY, "settings": {"device": "cpu", "threads": 1}}


@pytest.fixture(scope="module")
def relative(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("relative"), units=N, invariance=RELATIVE, candidate=UNPATCHED)


def _flip(ids: Iterable[str]) -> Any:
    """An output edit that flips the last bit of the first log-probability of the units `ids`: the same tokens,
    other bits, as a batch-variant kernel gives."""
    chosen = set(ids)

    def edit(outputs: list[dict[str, Any]]) -> None:
        for o in outputs:
            if o["request_id"] in chosen:
                o["logprobs"] = o["logprobs"].copy()
                o["logprobs"].view(np.uint32)[0] ^= 1

    return edit


def _run(ws: Workspace, run_dir: Path, varies: dict[str, Iterable[str]]) -> Path:
    """Every planned call answered correctly; under layout b4r, the units `varies[package]` of that package get
    other log-probability bits than under solo."""
    writer = RunWriter(ws, run_dir)
    workers = {"reference": writer.worker("reference"), "candidate": writer.worker("candidate", IDENTITY)}
    for planned in ws.plan.calls:
        changed = varies.get(planned.package, ()) if planned.layout == "b4r" else ()
        writer.generate(workers[planned.package], planned, edit_outputs=_flip(changed))
    return writer.close()


def test_the_reference_runs_every_invariance_layout(relative: Workspace) -> None:
    assert [c.key for c in relative.plan.calls] == ["reference/solo#0", "candidate/solo#0", "candidate/b4r#0",
                                                    "reference/b4r#0"]
    assert relative.plan.call("reference", "solo").purposes == ("pairing", "invariance")
    assert relative.plan.call("reference", "b4r").purposes == ("invariance",)
    assert b'"relative_to":"reference"' in relative.contract.canonical_json()


def test_a_contract_without_it_keeps_its_bytes_and_plan(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=20, candidate=UNPATCHED)
    assert b"relative_to" not in ws.contract.canonical_json()
    assert [c.key for c in ws.plan.calls] == ["reference/solo#0", "candidate/solo#0", "candidate/b4r#0"]
    d = admit(ws.contract_path, _run(ws, tmp_path / "run", {}))
    printed = d.output().model_dump(mode="json", exclude_unset=True)
    assert set(printed["invariance"]) == {"required", "layouts", "holds", "units", "units_differing",
                                          "first_difference", "covers"}
    assert set(receipt_body(d)["figures"]["invariance"]) == {"required", "layouts", "holds", "units_differing"}


def test_relative_to_needs_invariance_required(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"invariance.relative_to: invariance is not required"):
        make_workspace(tmp_path, units=20, invariance={"required": False, "layouts": [], "relative_to": "reference"},
                       layouts={"solo": {"batch_size": 1}}, candidate=UNPATCHED)


def test_dependence_the_reference_has_too_is_not_a_breach(relative: Workspace, tmp_path: Path) -> None:
    shared = unit_ids(relative, 40, 10)
    d = admit(relative.contract_path, _run(relative, tmp_path / "run", {"reference": shared, "candidate": shared}))
    assert d.answer is Answer.ADMITTED, d.reason
    inv = d.output().model_dump(mode="json", exclude_unset=True)["invariance"]
    assert inv["holds"] is True
    assert (inv["units_differing"], inv["reference_units_differing"], inv["candidate_units_differing"]) == (0, 40, 40)
    assert inv["gained_units"] == []
    assert inv["relative_to"] == "reference"


def test_added_dependence_is_violated_naming_the_units(relative: Workspace, tmp_path: Path) -> None:
    ref_varies = unit_ids(relative, 40, 10)
    gained = unit_ids(relative, 3, 200)
    run = _run(relative, tmp_path / "run", {"reference": ref_varies, "candidate": [*ref_varies[:5], *gained]})
    d = admit(relative.contract_path, run)
    assert d.answer is Answer.VIOLATED
    assert d.reason.startswith(f"invariance relative to the reference: 3 of {N} units gained layout dependence "
                               "across layouts solo, b4r (40 vary under the reference too and are not covered); "
                               f"unit {gained[0]}: log-probabilities differ at position 0")
    assert "the reference gives identical outputs across layouts solo, b4r" in d.reason
    inv = d.output().model_dump(mode="json", exclude_unset=True)["invariance"]
    assert (inv["holds"], inv["units_differing"], inv["candidate_units_differing"]) == (False, 3, 8)
    assert inv["gained_units"] == gained
    # The receipt states which units gained dependence.
    figures = receipt_body(d)["figures"]["invariance"]
    assert figures["gained_units"] == gained
    assert (figures["relative_to"], figures["reference_units_differing"]) == ("reference", 40)


def test_a_reference_that_varies_where_the_candidate_does_not_is_admitted(relative: Workspace,
                                                                          tmp_path: Path) -> None:
    # A kernel that removes layout dependence (a batch-invariant one) is not penalised for the reference's.
    d = admit(relative.contract_path, _run(relative, tmp_path / "run", {"reference": unit_ids(relative, 100)}))
    assert d.answer is Answer.ADMITTED, d.reason
    assert d.invariance.relative is not None
    assert (d.invariance.relative.reference_units_differing, d.invariance.relative.candidate_units_differing) == \
        (100, 0)
