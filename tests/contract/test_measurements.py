"""Plan /3: a contract's `[measurements]` put teacher forcing and captures into the plan; admission binds them to the
recorded responses, reports them beside the decision, and lets them decide only through `max_kl`."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from contract_runs import RunWriter, Workspace, make_workspace
from scipy.special import log_softmax
from support.cli_batch import Case, invar_batch

from invar.contract.admit import admit
from invar.contract.decide import Answer
from invar.contract.plan import measurement_params
from invar.errors import ContractError, EvidenceError
from invar.tasks.arithmetic import answer_of

UNITS = 40
MEASURE = {"capture_steps": [0, "last"]}
FINITE = {"standard": "finite-domain", "confidence": None, "method": None}
"""Decides on exactly these few units, so the answer shows what the measurements change."""


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("measure"), units=UNITS, measurements=MEASURE, requirement=FINITE)


def _capture(seed: int, rows: int, width: int) -> np.ndarray:
    return log_softmax(np.random.default_rng(seed).normal(0, 4, (rows, width)), axis=1).astype(np.float32)


def write_run(ws: Workspace, path: Path, *, candidate_capture: Callable[[int, int], np.ndarray] | None = None,
              teach: Callable[[np.ndarray, int], np.ndarray] | None = None, skip: str | None = None,
              tokens_of: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A complete plan /3 run: generate calls as `RunWriter.complete` writes them, then every measurement call with
    the reference's recorded responses; the candidate's captures and teacher-forced scores may be changed."""
    w = RunWriter(ws, path)
    keys = {"reference": w.worker("reference"), "candidate": w.worker("candidate")}
    responses: dict[tuple[str, int], dict[str, Any]] = {}
    for planned in ws.plan.calls:
        w.generate(keys[planned.package], planned)
        if planned.layout == ws.plan.pairing_layout:
            for index, out in zip(planned.units, w.outputs(planned, ()), strict=True):
                responses[(planned.package, index)] = out
    width = ws.vocab.size
    for m in ws.plan.measurements:
        if m.key == skip:
            continue
        params = measurement_params(ws.plan, m, lambda i, m=m: responses[(m.source, i)]["tokens"])
        if tokens_of is not None and m.package == "candidate":
            tokens_of(params)
        outputs = []
        for index, item in zip(m.units, params["items"], strict=True):
            lp = responses[(m.source, index)]["logprobs"].copy()
            if teach is not None and m.package == "candidate":
                lp = teach(lp, index)
            steps = item["vocab_steps"]
            vocab = _capture(index, len(steps), width)
            if candidate_capture is not None and m.package == "candidate":
                vocab = candidate_capture(index, len(steps))
            outputs.append({"item_id": item["item_id"], "logprobs": lp, "vocab_logprobs": vocab})
        package = ws.contract.package(m.package)
        patch_calls = {"patch_calls": {n: len(outputs) for n in package.patches}} if package.patches else {}
        w._call(keys[m.package], "score", params, {"outputs": outputs, "model_digest": package.model_digest,
                                                   "adapter_digest": None, **patch_calls})
    return w.close()


def test_measurements_make_plan_3_and_old_contracts_keep_their_bytes(ws: Workspace, tmp_path: Path) -> None:
    assert ws.plan.version == "invar.plan/3"
    batches = len(ws.plan.layout_calls("reference", "solo")[0].batches)  # solo: one unit per batch
    assert [m.key for m in ws.plan.measurements[:4]] == ["reference/measure#0", "candidate/measure#0",
                                                         "reference/measure#1", "candidate/measure#1"]
    assert len(ws.plan.measurements) == 2 * batches == 2 * UNITS
    assert all(m.source == "reference" for m in ws.plan.measurements)  # teacher forcing
    plain = make_workspace(tmp_path / "plain", units=UNITS)
    assert plain.plan.version == "invar.plan/2"
    assert b"measurements" not in plain.contract_path.read_bytes()
    assert json.loads(ws.contract_path.read_bytes())["measurements"] == {
        "capture_steps": [0, "last"], "max_kl": None, "teacher_forcing": True, "units": None}


def test_a_subset_of_units_is_whole_pairing_batches(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=UNITS, measurements={"units": 6, "capture_steps": ["every:2"]},
                        pairing={"layout": "b4r"}, invariance={"required": True, "layouts": ["b4r", "solo"]})
    covered = [m.units for m in ws.plan.measurements if m.package == "reference"]
    assert [len(u) for u in covered] == [4, 4]  # whole batches until at least 6 units are covered
    assert covered[0] == ws.plan.layout_calls("reference", "b4r")[0].units[:4]


@pytest.mark.parametrize(("section", "message"), [
    ({"teacher_forcing": False}, "nothing is measured"),
    ({"capture_steps": [0], "max_kl": -1}, "must be 0 or more"),
    ({"max_kl": 0.1}, "add capture_steps"),
    ({"capture_steps": ["first"]}, "is not a step"),
    ({"capture_steps": [True]}, "is not a step"),
])
def test_bad_measurements_are_one_line(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        make_workspace(tmp_path, units=8, measurements=section)


def test_measurements_are_reported_beside_the_decision_and_do_not_decide(ws: Workspace, tmp_path: Path) -> None:
    run = write_run(ws, tmp_path / "run",
                    candidate_capture=lambda i, rows: _capture(1000 + i, rows, ws.vocab.size))
    d = admit(ws.contract_path, run)
    assert d.answer is Answer.ADMITTED  # identical task losses; the large KL decides nothing without max_kl
    assert d.plan_version == "invar.plan/3"
    assert d.kl is None
    assert len(d.measurement_evidence) == 2 * UNITS
    out = d.output().model_dump(mode="json", exclude_unset=True)
    m = out["measurements"]
    assert m["teacher_forcing"]["units"] == UNITS
    assert m["teacher_forcing"]["identical"] == UNITS
    assert m["captures"]["captures"] > UNITS
    assert m["captures"]["identical"] == 0
    assert m["captures"]["kl_ref_cand"]["min"] > 0
    assert m["requirement"] is None
    assert [e["call"] for e in out["evidence"]][-2:] == [f"reference/measure#{UNITS - 1}",
                                                         f"candidate/measure#{UNITS - 1}"]


def test_max_kl_decides_when_the_contract_sets_it(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=UNITS, measurements={**MEASURE, "max_kl": "0.001"},
                        requirement=FINITE)
    same = write_run(ws, tmp_path / "same")
    d = admit(ws.contract_path, same)
    assert d.answer is Answer.ADMITTED
    assert d.kl is not None
    assert d.kl.holds
    far = write_run(ws, tmp_path / "far", candidate_capture=lambda i, rows: _capture(1000 + i, rows, ws.vocab.size))
    d = admit(ws.contract_path, far)
    assert d.answer is Answer.VIOLATED
    assert d.reason.startswith("measurements: unit ")
    assert "exceeds max_kl = 0.001 nats" in d.reason


def test_teacher_forcing_is_the_candidates_score_minus_the_references_own(ws: Workspace, tmp_path: Path) -> None:
    def teach(lp: np.ndarray, index: int) -> np.ndarray:
        if index == 3:
            lp = lp.copy()
            lp[0] -= np.float32(0.25)
        return lp

    d = admit(ws.contract_path, write_run(ws, tmp_path / "run", teach=teach))
    assert d.measurements is not None
    unit = next(u for u in d.measurements.units if u.unit_id == ws.plan.units[3].unit_id)
    assert unit.teacher is not None
    assert unit.teacher.first_large == 0
    assert unit.teacher.deltas[0] == pytest.approx(-0.25, abs=1e-6)
    taught = d.measurements.teacher_forcing()
    assert taught is not None
    assert taught.identical == UNITS - 1


def test_a_missing_or_foreign_measurement_is_refused(ws: Workspace, tmp_path: Path) -> None:
    run = write_run(ws, tmp_path / "missing", skip="candidate/measure#7")
    with pytest.raises(EvidenceError, match=r"planned measurement candidate/measure#7 \(score, 1 items\) has no "):
        admit(ws.contract_path, run)

    def other_tokens(params: dict[str, Any]) -> None:
        item = params["items"][0]
        item["response_tokens"] = item["response_tokens"][::-1].copy()

    run = write_run(ws, tmp_path / "foreign", tokens_of=other_tokens)
    with pytest.raises(EvidenceError, match=r"does not match planned measurement call candidate/measure#0: "
                                            r"params.items\[0\].response_tokens"):
        admit(ws.contract_path, run)


def test_compare_numerical_reads_a_use_run_with_its_contract(ws: Workspace, tmp_path: Path) -> None:
    run = write_run(ws, tmp_path / "run", candidate_capture=lambda i, rows: _capture(1000 + i, rows, ws.vocab.size))
    # The three command lines in one process (tests/support/cli_batch.py), each as `python -m invar.cli` runs it.
    out, text, wrong = invar_batch([
        Case(["compare", "numerical", run, "--contract", ws.contract_path, "--json"]),
        Case(["compare", "numerical", run, "--contract", ws.contract_path, "--report", tmp_path / "r.html"]),
        Case(["compare", "numerical", run]),
    ], bound_s=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["generation"]["units"] == UNITS
    assert doc["teacher_forcing"]["identical"] == UNITS
    full = admit(ws.contract_path, run).output().model_dump(mode="json", exclude_unset=True)
    decided = full["measurements"]
    assert doc["captures"] == decided["captures"]  # streamed or held, the same numbers
    # The headline's decision is admission's own.
    assert doc["decision"] == {k: full[k] for k in ("answer", "reason", "standard", "epsilon", "delta", "bound",
                                                    "task_loss")}
    assert doc["worst"][0]["expected"] == str(answer_of(doc["worst"][0]["prompt"]))
    schema = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "compare-numerical.schema.json"
    jsonschema.Draft202012Validator(json.loads(schema.read_text(encoding="utf-8"))).validate(doc)
    assert text.returncode == 0, text.stderr
    assert f"decision                   {full['answer']}: {full['reason']}" in text.stdout.splitlines()[:8]
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert page.index(f"{full['answer']}: {html.escape(full['reason'])}") < page.index("Where they part")
    assert wrong.returncode == 2
    assert "not a use run" in wrong.stderr


def test_without_teacher_forcing_each_package_captures_along_its_own_responses(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=UNITS, requirement=FINITE,
                        measurements={"teacher_forcing": False, "capture_steps": [0, 1]})
    assert {(m.package, m.source) for m in ws.plan.measurements} == {("reference", "reference"),
                                                                    ("candidate", "candidate")}
    d = admit(ws.contract_path, write_run(ws, tmp_path / "run"))
    assert d.measurements is not None
    assert d.measurements.context == "own"
    assert d.measurements.teacher_forcing() is None  # the candidate scored only its own responses
    caps = d.measurements.capture_summary()
    assert caps is not None
    assert caps.captures == 2 * UNITS  # every response has steps 0 and 1, and the responses agree
    assert caps.identical == caps.captures
