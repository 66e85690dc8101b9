"""Sequential admission in the contract, the plan and admission, without engines: the plan's section (plan /4), the
declaration's rules (one line each), and `use admit` recomputing the stop from records written through the store,
refusing runs that went on past the stop, stopped before it, or left a look incomplete."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract_runs import RunWriter, Workspace, declaration, make_model, make_workspace, toml_text
from support.cli_batch import InvarSession

from invar import canonical
from invar.contract.admit import admit
from invar.contract.bind import SEQUENTIAL_META, stop_record
from invar.contract.decide import Answer
from invar.contract.plan import PLAN_VERSION_4
from invar.contract.prepare import prepare
from invar.errors import ContractError, EvidenceError
from invar.tasks.arithmetic import population, population_bytes

UNITS = 48
SEQUENTIAL: dict[str, Any] = {
    "requirement": {"epsilon": 0.2, "method": "paired-binary-sequence", "sequential": True, "max_n": UNITS},
    "layouts": {"solo": {"batch_size": 1}},
    "invariance": {"required": False, "layouts": None},
    "execution": {"requests_per_call": 16},
}


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("seq"), units=UNITS, **SEQUENTIAL)


def _run(ws: Workspace, path: Path, looks: list[tuple[str, ...]] | int, *, candidate_wrong: tuple[str, ...] = (),
         meta: dict[str, Any] | None = None) -> Path:
    """A closed run holding the calls of the first `looks` looks (or exactly the listed call keys)."""
    w = RunWriter(ws, path)
    ref, cand = w.worker("reference"), w.worker("candidate")
    keys = [c.key for k in range(looks) for c in ws.plan.look_calls(k)] if isinstance(looks, int) else \
        [key for group in looks for key in group]
    by_key = {c.key: c for c in ws.plan.calls}
    for key in keys:
        planned = by_key[key]
        w.generate(ref if planned.package == "reference" else cand, planned,
                   candidate_wrong if planned.package == "candidate" else ())
    if meta is not None:
        w.store.put_meta(SEQUENTIAL_META, meta)
    return w.close()


def test_the_plan_section_fixes_method_order_and_looks(ws: Workspace) -> None:
    plan, contract = ws.plan, ws.contract
    assert plan.version == PLAN_VERSION_4
    section = plan.sequential
    assert section is not None
    assert (section.method, section.version, section.n_max) == ("paired-binary-sequence",
                                                                "paired-binary-sequence/1", UNITS)
    assert section.boundaries == (16, 32, 48)
    assert contract.method_version == "paired-binary-sequence/1"
    # Look k is part k of both packages' pairing calls, and the rule reads their units in call order.
    for look in range(3):
        calls = plan.look_calls(look)
        assert sorted(c.package for c in calls) == ["candidate", "reference"]
        assert {c.units for c in calls} == {section.order[16 * look: 16 * (look + 1)]}
    assert sorted(section.order) == list(range(UNITS))
    assert section.look_units(2) == section.order[:32]
    data = canonical.sha256(contract.canonical_json())
    assert data == ws.sha256
    assert b'"sequential":true' in contract.canonical_json()
    assert b'"max_n":48' in contract.canonical_json()


def test_a_fixed_n_contract_keeps_its_bytes(tmp_path: Path) -> None:
    fixed = make_workspace(tmp_path, units=20)
    text = fixed.contract.canonical_json()
    assert b"sequential" not in text
    assert b"max_n" not in text
    assert fixed.plan.sequential is None
    assert fixed.plan.version != PLAN_VERSION_4


def _declare(tmp_path: Path, units: int = UNITS, **changes: Any) -> Path:
    model_digest = make_model(tmp_path / "model")
    data = population_bytes(population("eval", seed=11, count=units, id_prefix="u"))
    (tmp_path / "population.jsonl").write_bytes(data)
    merged = {**SEQUENTIAL, **changes}
    if "requirement" in changes:
        merged["requirement"] = {**SEQUENTIAL["requirement"], **changes["requirement"]}
    decl = declaration(canonical.sha256(data), model_digest, **merged)
    (tmp_path / "decl.toml").write_text(toml_text(decl), encoding="utf-8")
    return tmp_path / "decl.toml"


@pytest.mark.parametrize(("changes", "message"), [
    ({"requirement": {"max_n": None}}, "requirement.max_n: sequential admission needs the most units a run may use"),
    ({"requirement": {"sequential": None, "method": "paired-binary-score"}},
     "requirement.max_n: only a sequential contract has a maximum n"),
    ({"requirement": {"method": "paired-binary-exact"}}, "requirement.method: 'paired-binary-exact' is not a "
                                                         "sequential method"),
    ({"requirement": {"sequential": None, "max_n": None}}, "(a sequential method: add sequential = true and max_n)"),
    ({"invariance": {"required": True, "layouts": ["solo", "b4r"]},
      "layouts": {"solo": {"batch_size": 1}, "b4r": {"batch_size": 4, "order": "reverse"}}},
     "requirement.sequential: a sequential run stops its pairing calls early"),
    ({"requirement": {"max_n": 40}}, "requirement.max_n: 40 units, but the plan runs 48"),
    ({"measurements": {"teacher_forcing": True}}, "requirement.sequential: measurements cover batches a sequential "
                                                  "run may never reach"),
    ({"requirement": {"standard": "finite-domain", "confidence": None, "method": None}},
     "requirement.sequential: the finite-domain standard decides on every declared unit"),
])
def test_bad_sequential_declarations_are_one_line(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    decl = _declare(tmp_path, **changes)
    with pytest.raises(ContractError) as info:
        prepare(decl)
    text = str(info.value)
    assert message in text, text
    assert "\n" not in text


def test_admit_recomputes_the_stop(ws: Workspace, tmp_path: Path) -> None:
    # Every answer equal: d = 0, upper 0.295 after 16 units (> ε = 0.2), 0.164 after 32 (≤ ε): Admitted at look 2.
    run = _run(ws, tmp_path / "run", 2)
    decision = admit(ws.contract_path, run)
    assert decision.answer is Answer.ADMITTED
    assert decision.sequential is not None
    assert (decision.sequential.stop, len(decision.sequential.looks)) == (32, 2)
    assert decision.task_loss.n == 32
    assert "stopped at look 2 with 32 of n_max = 48 units" in decision.reason
    assert "paired-binary-sequence/1" in decision.reason
    assert sorted(e.key for e in decision.evidence) == sorted(c.key for k in range(2) for c in ws.plan.look_calls(k))


def test_a_broken_candidate_is_violated_at_the_first_look(ws: Workspace, tmp_path: Path) -> None:
    assert ws.plan.sequential is not None
    first = [ws.plan.units[i].unit_id for i in ws.plan.sequential.look_units(1)]
    run = _run(ws, tmp_path / "run", 1, candidate_wrong=tuple(first[:14]))
    decision = admit(ws.contract_path, run)
    assert decision.answer is Answer.VIOLATED
    assert decision.bound is not None
    assert decision.bound.lower > 0.2
    assert "stopped at look 1 with 16 of n_max = 48 units" in decision.reason


def test_the_recorded_stop_must_match_the_records(ws: Workspace, tmp_path: Path) -> None:
    run = _run(ws, tmp_path / "ok", 2)
    decision = admit(ws.contract_path, run)
    assert decision.sequential is not None
    found = {e.key: e for e in decision.evidence}
    entry = stop_record(decision.sequential, ws.plan, found)
    kept = _run(ws, tmp_path / "kept", 2, meta=entry)
    assert admit(ws.contract_path, kept).answer is Answer.ADMITTED
    wrong = _run(ws, tmp_path / "wrong", 2, meta={**entry, "answer": "Violated"})
    with pytest.raises(EvidenceError, match=r"the stop the run recorded is not the one its records give: "
                                            r"sequential_stop.answer is 'Violated' in the record"):
        admit(ws.contract_path, wrong)


@pytest.mark.parametrize(("looks", "message"), [
    (3, "the run holds 48 units but the stopping rule stops at 32 (Admitted); a sequential run must stop exactly "
        "where the rule says"),
    (1, "the run stopped after 16 units, where the stopping rule does not stop"),
    (0, "the run holds no complete look"),
])
def test_a_run_that_went_past_the_stop_or_stopped_before_it_is_refused(
        ws: Workspace, tmp_path: Path, looks: int, message: str) -> None:
    run = _run(ws, tmp_path / "run", looks)
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_an_incomplete_look_is_refused(ws: Workspace, tmp_path: Path) -> None:
    look0 = tuple(c.key for c in ws.plan.look_calls(0))
    ref1 = tuple(c.key for c in ws.plan.look_calls(1) if c.package == "reference")
    run = _run(ws, tmp_path / "run", [look0, ref1])
    with pytest.raises(EvidenceError, match=r"planned call reference/solo#1 \(look 2\) is on record, but look 2 "
                                            r"lacks candidate/solo#1; a sequential run completes each look"):
        admit(ws.contract_path, run)


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=300) as session:
        yield session


def test_use_admit_refuses_a_run_past_the_stop_with_one_line_and_exit_2(cli: InvarSession, ws: Workspace,
                                                                         tmp_path: Path) -> None:
    run = _run(ws, tmp_path / "run", 3)
    done = cli.run("use", "admit", run, "--contract", ws.contract_path, "--quiet")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "stopping rule stops at 32" in lines[0]


def test_compare_numerical_reads_a_run_stopped_early_by_the_looks_it_reached(cli: InvarSession, ws: Workspace,
                                                                             tmp_path: Path) -> None:
    # It used to fail with a KeyError on the first call of a look the run never reached.
    assert ws.plan.sequential is not None
    run = _run(ws, tmp_path / "run", 2)
    out = cli.run("compare", "numerical", run, "--contract", ws.contract_path, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    reached = [ws.plan.units[i].unit_id for i in ws.plan.sequential.look_units(2)]
    assert [u["unit_id"] for u in doc["units"]] == reached  # the rule's order, 32 of the 48 planned
    assert doc["decision"]["answer"] == "Admitted"
