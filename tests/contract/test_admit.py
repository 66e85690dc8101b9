"""`use admit` on runs written through the record store: the three answers, the finite-domain standard, and
every kind of bad evidence refused with a message naming the record."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from contract_runs import (
    CANDIDATE_IDENTITY,
    REFERENCE_IDENTITY,
    RunWriter,
    Workspace,
    make_workspace,
    tamper_body,
    unit_ids,
)

from invar.contract.admit import admit
from invar.contract.decide import Answer
from invar.errors import ContractError, EvidenceError, RecordError
from invar.records import RunStore

N = 600  # units of the population-standard tests: enough for the bound to decide at ε = 0.05


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("pop"), units=N)


@pytest.fixture(scope="module", params=["maurer-pontil", "paired-binary-exact"])
def each_method(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The same contract decided by the empirical Bernstein bound and by the exact paired-binary bound."""
    return make_workspace(tmp_path_factory.mktemp(request.param), units=N,
                          requirement={"method": request.param})


def _name(run: Path, worker: str, call_id: int) -> str:
    with RunStore.open(run) as store:
        return next(r.name for r in store.calls() if r.worker == worker and r.call.call_id == call_id)


def test_admitted(each_method: Workspace, tmp_path: Path) -> None:
    ws = each_method
    run = RunWriter(ws, tmp_path / "run").complete(
        reference_wrong=unit_ids(ws, 3, 0), candidate_wrong=unit_ids(ws, 3, 100)).close()
    d = admit(ws.contract_path, run)
    assert d.answer is Answer.ADMITTED
    assert d.exit_code == 0
    assert d.bound is not None
    assert d.bound.upper <= 0.05
    assert d.bound.lower <= 0.0 <= d.bound.upper
    assert d.bound.n == N
    assert (d.task_loss.n, d.task_loss.worse, d.task_loss.better) == (N, 3, 3)
    assert d.task_loss.mean_difference == 0
    assert d.invariance.holds
    assert d.invariance.layouts == ("solo", "b4r")
    assert [e.key for e in d.evidence] == ["reference/solo#0", "candidate/solo#0", "candidate/b4r#0"]
    assert all(len(e.call_digest) == 64 and len(e.report_digest) == 64 for e in d.evidence)
    out = d.output().model_dump(mode="json", exclude_unset=True)
    assert out["answer"] == "Admitted"
    assert out["contract"]["sha256"] == ws.sha256
    assert out["bound"]["method"] == ws.contract.requirement.method
    assert out["bound"]["version"] == f"{ws.contract.requirement.method}/1"
    assert out["bound"]["version"] == ws.contract.method_version
    assert out["decision_version"] == "invar.admit/1"
    assert out["premises"][0]["party"] == "data-team"
    assert out["premises"][0]["basis_sha256"] == "d" * 64
    assert set(out["diagnostics"]) >= {"paired_wald", "mcnemar_exact_one_sided", "hoeffding"}
    again = admit(ws.contract_path, run).output().model_dump(mode="json", exclude_unset=True)
    assert again == out  # replayed from the same records: the same decision


def test_violated_when_the_lower_bound_exceeds_epsilon(each_method: Workspace, tmp_path: Path) -> None:
    ws = each_method
    run = RunWriter(ws, tmp_path / "run").complete(candidate_wrong=unit_ids(ws, 150)).close()
    d = admit(ws.contract_path, run)
    assert d.answer is Answer.VIOLATED
    assert d.exit_code == 10
    assert d.bound is not None
    assert d.bound.lower > 0.05
    assert d.task_loss.mean_difference == Fraction(150, N)


def test_unknown_when_the_bound_straddles_epsilon(each_method: Workspace, tmp_path: Path) -> None:
    ws = each_method
    run = RunWriter(ws, tmp_path / "run").complete(candidate_wrong=unit_ids(ws, 30)).close()
    d = admit(ws.contract_path, run)
    assert d.answer is Answer.UNKNOWN
    assert d.exit_code == 11
    assert d.bound is not None
    assert d.bound.lower <= 0.05 < d.bound.upper
    assert "does not decide" in d.reason


def test_scores_are_recomputed_from_tokens_not_trusted(ws: Workspace, tmp_path: Path) -> None:
    # A worker that adds its own "score" or text to an output changes nothing: the core decodes the tokens.
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")

    def claim_correct(outputs: list[dict[str, Any]]) -> None:
        for o in outputs:
            o["text"] = "42"
            o["loss"] = 0

    wrong = unit_ids(ws, 150)
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else cand
        writer.generate(worker, planned, wrong if planned.package == "candidate" else (), edit_outputs=claim_correct)
    d = admit(ws.contract_path, writer.close())
    assert d.task_loss.candidate_loss == 150
    assert d.answer is Answer.VIOLATED


def test_finite_domain_decides_exactly_on_the_declared_units(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=40,
                        requirement={"standard": "finite-domain", "epsilon": "0.025", "confidence": None,
                                     "method": None})
    at_epsilon = RunWriter(ws, tmp_path / "r1").complete(candidate_wrong=unit_ids(ws, 1)).close()
    d = admit(ws.contract_path, at_epsilon)
    assert d.answer is Answer.ADMITTED  # 1/40 = ε exactly: within the allowance
    assert d.task_loss.mean_difference == Fraction(1, 40)
    assert d.bound is None
    assert d.delta is None
    assert "no claim beyond these units" in d.reason
    assert d.output().model_dump(mode="json", exclude_unset=True)["bound"] is None
    over = RunWriter(ws, tmp_path / "r2").complete(candidate_wrong=unit_ids(ws, 2)).close()
    d2 = admit(ws.contract_path, over)
    assert d2.answer is Answer.VIOLATED
    assert d2.task_loss.mean_difference == Fraction(1, 20)
    assert d2.exit_code == 10


def test_invariance_failure_is_a_violation(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")

    def flip_last_bit(outputs: list[dict[str, Any]]) -> None:
        lp = outputs[7]["logprobs"]
        lp[1] = np.float32(np.nextafter(lp[1], np.float32(0)))

    for planned in ws.plan.calls:
        edit = flip_last_bit if planned.key == "candidate/b4r#0" else None
        writer.generate(ref if planned.package == "reference" else cand, planned, edit_outputs=edit)
    d = admit(ws.contract_path, writer.close())
    assert d.answer is Answer.VIOLATED
    assert not d.invariance.holds
    assert d.invariance.units_differing == 1
    unit = ws.plan.units[ws.plan.call("candidate", "b4r").units[7]].unit_id  # the b4r call lists units reversed
    assert f"unit {unit}: log-probabilities differ at position 1 between layouts solo and b4r" in d.reason
    assert d.bound is not None
    assert d.bound.upper <= 0.05  # the task loss alone would have admitted it


def test_invariance_not_required_runs_only_the_pairing_calls(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=N, layouts={"solo": {"batch_size": 1}},
                        invariance={"required": False, "layouts": []})
    assert [c.key for c in ws.plan.calls] == ["reference/solo#0", "candidate/solo#0"]
    d = admit(ws.contract_path, RunWriter(ws, tmp_path / "run").complete().close())
    assert d.answer is Answer.ADMITTED
    assert not d.invariance.required


def test_checked_premise_that_no_longer_holds_leaves_the_answer_unknown(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    (root / "memo.txt").write_text("NF4 kernels are deterministic on this CPU.\n")
    from invar import canonical

    premise = {"statement": "NF4 kernels are deterministic.", "party": "kernel team",
               "basis_sha256": canonical.file_sha256(root / "memo.txt"), "reliance": "checked",
               "basis_path": "memo.txt"}
    ws = make_workspace(root, units=N, premises=[premise])
    run = RunWriter(ws, tmp_path / "run").complete().close()
    assert admit(ws.contract_path, run).answer is Answer.ADMITTED
    (root / "memo.txt").write_text("NF4 kernels are deterministic on this CPU, mostly.\n")
    d = admit(ws.contract_path, run)
    assert d.answer is Answer.UNKNOWN
    assert d.exit_code == 11
    assert "premise not held as declared (checked)" in d.reason
    assert not d.premises[0].holds


# --- refused evidence --------------------------------------------------------------------------------------------


def test_missing_call_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")
    for planned in ws.plan.calls[:2]:
        writer.generate(ref if planned.package == "reference" else cand, planned)
    with pytest.raises(EvidenceError, match=r"planned call candidate/b4r#0 \(generate, 600 requests\) has no "
                                            "successful record; run the whole plan"):
        admit(ws.contract_path, writer.close())


def test_unanswered_call_is_named_in_the_refusal(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else cand
        call_id = writer.generate(worker, planned, answered=planned.key != "candidate/b4r#0")
    run = writer.close()
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    assert f"({_name(run, cand, call_id)} was never answered)" in str(info.value)


def test_tampered_report_is_refused(ws: Workspace, tmp_path: Path) -> None:
    run = RunWriter(ws, tmp_path / "run").complete(candidate_wrong=unit_ids(ws, 150)).close()
    with RunStore.open(run) as store:
        last = store.calls()[-1]  # candidate/b4r
    assert last.report is not None

    def zero_logprobs(message: dict[str, Any]) -> None:
        o = message["result"]["outputs"][0]
        o["logprobs"] = np.zeros_like(o["logprobs"])

    tamper_body(run, last.report.seq, zero_logprobs)
    with pytest.raises(RecordError, match=rf"record {last.report.seq} \(report\): its bytes do not match its digest"):
        admit(ws.contract_path, run)


def test_report_from_the_wrong_package_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")
    other = writer.worker("candidate", {**CANDIDATE_IDENTITY, "engine_version": {
        **CANDIDATE_IDENTITY["engine_version"], "bitsandbytes": "0.49.0"}})
    call_id = 0
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else (other if planned.layout == "b4r" else cand)
        call_id = writer.generate(worker, planned)
    run = writer.close()
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    msg = str(info.value)
    assert msg.startswith(f"{_name(run, other, call_id)}: made by a package that is neither reference nor candidate")
    assert "package.engine_version.bitsandbytes is '0.49.0' in the record, '0.50.2' in the contract" in msg


def test_model_loaded_with_other_settings_is_the_wrong_package(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref = writer.worker("reference")
    cand = writer.worker("candidate", quantization="none")
    call_id = 0
    for planned in ws.plan.calls:
        call_id = writer.generate(ref if planned.package == "reference" else cand, planned)
    run = writer.close()
    with pytest.raises(EvidenceError, match=r"package.quantization is 'none' in the record, 'nf4' in the contract"):
        admit(ws.contract_path, run)
    assert call_id == 3


def test_seed_that_differs_from_the_contract_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")
    expected = ws.plan.seeds[5]

    def reseed(params: dict[str, Any]) -> None:
        params["requests"][5]["seed"] += 1

    ids = {}
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else cand
        ids[planned.key] = writer.generate(worker, planned, edit_params=reseed if planned.key == "candidate/solo#0"
                                           else None)
    run = writer.close()
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    assert str(info.value) == (
        f"{_name(run, cand, ids['candidate/solo#0'])}: does not match planned call candidate/solo#0 (nor any other): "
        f"params.requests[5].seed is {expected + 1} in the record, {expected} in the contract"
    )


def test_run_made_under_another_contract_is_refused(ws: Workspace, tmp_path: Path) -> None:
    run = RunWriter(ws, tmp_path / "run", contract_sha256="f" * 64).complete().close()
    with pytest.raises(EvidenceError, match="the run was made under contract ffffffffffffffff…, not the given"):
        admit(ws.contract_path, run)


def test_repeated_call_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run").complete()
    cand = writer.store.record_worker(CANDIDATE_IDENTITY)
    call_id = writer.generate(cand, ws.plan.calls[2])
    run = writer.close()
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    assert str(info.value).startswith(f"{_name(run, cand, call_id)}: repeats planned call candidate/b4r#0, "
                                      "already answered by record 12")


def test_output_that_contradicts_its_request_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")

    def drop_eos(outputs: list[dict[str, Any]]) -> None:
        outputs[3]["tokens"] = outputs[3]["tokens"][:-1]
        outputs[3]["logprobs"] = outputs[3]["logprobs"][:-1]

    ids = {}
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else cand
        ids[planned.key] = writer.generate(worker, planned, edit_outputs=drop_eos if planned.package == "reference"
                                           else None)
    run = writer.close()
    unit = ws.plan.units[3].unit_id
    with pytest.raises(EvidenceError, match=rf"output 3 \({unit}\): finish_reason stop, but the tokens do not end"):
        admit(ws.contract_path, run)


def test_generate_report_naming_another_model_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")
    ids = {}
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else cand
        other = {"model_digest": "e" * 64} if planned.key == "candidate/b4r#0" else {}
        ids[planned.key] = writer.generate(worker, planned, result_changes=other)
    run = writer.close()
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    assert str(info.value).startswith(f"{_name(run, cand, ids['candidate/b4r#0'])}: its report names model eeeeeeee")


def test_generate_by_a_learner_worker_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref = writer.worker("reference", {**REFERENCE_IDENTITY, "role": "learner"})
    call_id = writer.generate(ref, ws.plan.calls[0])
    run = writer.close()
    with pytest.raises(EvidenceError, match=re.escape(f"{_name(run, ref, call_id)}: made by a learner worker")):
        admit(ws.contract_path, run)


def test_contract_of_another_method_version_is_refused(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=30)
    raw = ws.contract_path.read_bytes()
    edited = raw.replace(b'"method_version":"maurer-pontil/1"', b'"method_version":"maurer-pontil/0"')
    assert edited != raw
    ws.contract_path.write_bytes(edited)
    run = RunWriter(ws, tmp_path / "run").complete().close()
    with pytest.raises(ContractError, match=r"method_version: the contract fixes maurer-pontil/0, this Invar computes "
                                            r"maurer-pontil/1"):
        admit(ws.contract_path, run)


def test_tokenizer_other_than_the_contracts_is_refused(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=30)
    run = RunWriter(ws, tmp_path / "run").complete().close()
    config = ws.root / "model" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("</s>", "<s>", 1))
    with pytest.raises(ContractError, match=r"reference\.model_dir: the tokenizer files in .* are not the ones"):
        admit(ws.contract_path, run)


def test_token_outside_the_vocabulary_is_refused(ws: Workspace, tmp_path: Path) -> None:
    writer = RunWriter(ws, tmp_path / "run")
    ref, cand = writer.worker("reference"), writer.worker("candidate")

    def foreign_token(outputs: list[dict[str, Any]]) -> None:
        outputs[2]["tokens"][0] = 999

    ids = {}
    for planned in ws.plan.calls:
        worker = ref if planned.package == "reference" else cand
        ids[planned.key] = writer.generate(worker, planned, edit_outputs=foreign_token if planned.package ==
                                           "reference" else None)
    run = writer.close()
    with pytest.raises(EvidenceError) as info:
        admit(ws.contract_path, run)
    assert str(info.value).startswith(f"{_name(run, ref, ids['reference/solo#0'])}: token id 999 is outside the "
                                      "vocabulary of 17 tokens")


def test_crossing_one_sided_bounds_never_decide(tmp_path: Path) -> None:
    from invar.contract.decide import Invariance, decide
    from invar.evidence import TaskLoss
    from invar.stats import Bound

    ws = make_workspace(tmp_path / "ws", units=20)
    invariance = Invariance(required=False, layouts=(), holds=True, units=20, units_differing=0,
                            first_difference=None)
    loss = TaskLoss(n=20, reference_loss=2, candidate_loss=3, worse=1, better=0)
    # Each side is a valid one-sided bound, yet together empty: both "upper ≤ ε" and "lower > ε" would hold.
    crossed = Bound("betting", "betting/1", 20, 0.05, 0.05, lower=0.9, upper=-0.5)
    answer, reason = decide(ws.contract, invariance, [], loss, crossed)
    assert answer is Answer.UNKNOWN
    assert "bounds cross" in reason
