"""Task losses in a declared range (a user scorer with `binary = false` and `loss_range = [a, b]`) through the
contract, without engines: `use prepare` accepts them with a bounded-range method and refuses a binary one (and a
binary sequential one) in one line; admission scores every response into float losses, bound to the records as 0/1
losses are, and decides on the bound over [a − b, b − a]. Every figure is checked against a recomputation here from
the responses written (not from the scorer), and the bounds' coverage on such losses by simulation."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from contract_runs import RunWriter, Workspace, make_workspace
from scipy import stats
from support.cli_batch import InvarSession
from typer.testing import CliRunner

from invar.cli import use
from invar.contract.admit import admit
from invar.contract.decide import Answer
from invar.contract.plan import PlannedCall
from invar.contract.prepare import prepare
from invar.contract.receipt import make_receipt, verify_receipt, write_receipt
from invar.errors import ContractError, InvarError
from invar.evidence import RangeTaskLoss
from invar.records import RunStore
from invar.stats import bounds, sequential
from invar.stats.planning import Assumed, plan_row
from invar.tasks.arithmetic import answer_of

REPO_ROOT = Path(__file__).resolve().parents[2]

PARTIAL = '''import re


def loss(unit, response, params):
    """Partial credit: |the first number in the response - the answer| / scale, capped at cap; no number is cap."""
    scale, cap = params.get("scale", 10), params.get("cap", 1)
    found = re.search(r"-?[0-9]+", response)
    if found is None:
        return cap
    return min(cap, abs(int(found.group()) - int(unit.answer)) / scale)
'''
RANGE = {"name": "partial.py:loss", "settings": {"loss_range": [0, 1], "binary": False}}
SOLO: dict[str, Any] = {"layouts": {"solo": {"batch_size": 1}}, "invariance": {"required": False, "layouts": None}}
DELTA = 0.05
UNITS = 40
RUNNER = CliRunner()


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=120) as session:
        yield session


def _workspace(root: Path, scorer: dict[str, Any] | None = None, units: int = UNITS, **changes: Any) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    (root / "partial.py").write_text(PARTIAL)
    merged = {**SOLO, **changes}
    return make_workspace(root, units=units, scorer=scorer or RANGE, **merged)


def _offsets(ws: Workspace, seed: int, spread: int) -> dict[str, int]:
    """How far each unit's response is from its answer: a seeded draw in [-spread, spread], per unit id."""
    rng = np.random.default_rng(seed)
    return {u.unit_id: int(rng.integers(-spread, spread + 1)) for u in ws.plan.units}


def _run(ws: Workspace, path: Path, reference: dict[str, int], candidate: dict[str, int]) -> Path:
    """A closed run of the whole plan in which unit u's response is the number answer + offset[u]."""
    writer = RunWriter(ws, path)
    workers = {"reference": writer.worker("reference"), "candidate": writer.worker("candidate")}
    offsets = {"reference": reference, "candidate": candidate}

    def answer(planned: PlannedCall) -> Any:
        def edit(outputs: list[dict[str, Any]]) -> None:
            for out, req in zip(outputs, planned.params.to_wire()["requests"], strict=True):
                text = str(answer_of(req["prompt"]) + offsets[planned.package][req["request_id"]])
                out["tokens"] = np.array([*ws.vocab.encode(text), ws.vocab.eos_token_id], dtype=np.int32)
                out["logprobs"] = -np.random.default_rng(req["seed"]).random(len(out["tokens"])).astype(np.float32)
        return edit

    for planned in ws.plan.calls:
        writer.generate(workers[planned.package], planned, edit_outputs=answer(planned))
    return writer.close()


def _losses(ws: Workspace, offsets: dict[str, int], scale: float = 10, cap: float = 1) -> np.ndarray:
    """The partial-credit loss of each planned unit, in plan order, computed from the offsets (not by the scorer)."""
    return np.array([min(cap, abs(offsets[u.unit_id]) / scale) for u in ws.plan.units], dtype=np.float64)


def _delta(text: str) -> float:
    """The contract's δ as the largest float not above it."""
    x = float(text)
    return math.nextafter(x, 0.0) if Fraction(x) > Fraction(text) else x


# --- use prepare ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["hoeffding", "maurer-pontil", "betting"])
def test_a_range_scorer_is_prepared_with_a_bounded_range_method(tmp_path: Path, method: str) -> None:
    ws = _workspace(tmp_path, requirement={"method": method})
    assert ws.contract.scorer.settings == {"loss_range": [0, 1], "binary": False}
    assert ws.contract.method_version == bounds.VERSIONS[method]
    assert ws.contract.scorer.sha256 is not None


@pytest.mark.parametrize("method", ["paired-binary-exact", "paired-binary-score"])
def test_a_binary_method_with_a_range_scorer_is_one_line_at_prepare(cli: InvarSession, tmp_path: Path,
                                                                    method: str) -> None:
    with pytest.raises(ContractError):
        _workspace(tmp_path / "api", requirement={"method": method})
    (tmp_path / "cli").mkdir()
    out = cli.run("use", "prepare", tmp_path / "api" / "decl.toml", "--out", tmp_path / "cli")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [f"invar: error: requirement.method: {method} decides on 0/1 losses, but scorer partial.py:loss "
                     "gives losses in [0, 1] (binary = false); use hoeffding or maurer-pontil or betting, or declare "
                     "the scorer binary = true with loss_range = [0, 1]"]
    assert not list((tmp_path / "cli").iterdir())  # nothing written


def test_a_binary_sequential_method_is_refused_and_betting_sequence_is_prepared(tmp_path: Path) -> None:
    seq = {"epsilon": 0.2, "sequential": True, "max_n": 48}
    with pytest.raises(ContractError) as info:
        _workspace(tmp_path / "binary", units=48, execution={"requests_per_call": 16},
                   requirement={**seq, "method": "paired-binary-sequence"})
    assert str(info.value) == ("requirement.method: paired-binary-sequence decides on 0/1 losses, but scorer "
                               "partial.py:loss gives losses in [0, 1] (binary = false); use betting-sequence, or "
                               "declare the scorer binary = true with loss_range = [0, 1]")
    ws = _workspace(tmp_path / "betting", units=48, execution={"requests_per_call": 16},
                    requirement={**seq, "method": "betting-sequence"})
    assert ws.plan.sequential is not None
    assert ws.contract.method_version == "betting-sequence/1"


def test_epsilon_is_in_loss_units_up_to_the_span_of_the_range(tmp_path: Path) -> None:
    wide = {"name": "partial.py:loss", "settings": {"loss_range": [0, 10], "binary": False}}
    ws = _workspace(tmp_path / "ok", scorer=wide, requirement={"epsilon": 2.5})
    assert str(ws.contract.requirement.epsilon) == "2.5"
    with pytest.raises(ContractError, match=r"requirement\.epsilon: must be in \(0, 10\) for losses in the scorer's "
                                            r"loss_range \(at most b − a\); got 10"):
        _workspace(tmp_path / "span", scorer=wide, requirement={"epsilon": 10})
    with pytest.raises(ContractError, match=r"requirement\.epsilon: must be in \(0, 1\); got 2\.5"):
        _workspace(tmp_path / "binary", scorer={"name": "arithmetic-exact"}, requirement={"epsilon": 2.5})


# --- admission -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["hoeffding", "maurer-pontil", "betting"])
def test_admission_decides_on_float_losses_bound_to_the_records(tmp_path: Path, method: str) -> None:
    ws = _workspace(tmp_path, requirement={"method": method, "epsilon": 0.2})
    ref, cand = _offsets(ws, 1, 3), _offsets(ws, 2, 4)
    run = _run(ws, tmp_path / "run", ref, cand)
    decision = admit(ws.contract_path, run)

    r, c = _losses(ws, ref), _losses(ws, cand)
    assert len(set(r.tolist()) | set(c.tolist())) > 2  # partial credit, not 0/1
    loss = decision.task_loss
    assert isinstance(loss, RangeTaskLoss)
    assert (loss.n, loss.loss_range) == (UNITS, (0.0, 1.0))
    assert loss.reference_loss == sum(Fraction(x) for x in r.tolist())
    assert loss.candidate_loss == sum(Fraction(x) for x in c.tolist())
    assert loss.mean_difference == (loss.candidate_loss - loss.reference_loss) / UNITS
    assert (loss.worse, loss.better) == (int((c > r).sum()), int((c < r).sum()))
    # The bound is the method's on d in [-1, 1], recomputed here from the losses the responses carry.
    expected = bounds.bound(method, c - r, -1.0, 1.0, _delta("0.05"))
    assert decision.bound is not None
    assert (decision.bound.method, decision.bound.version, decision.bound.n) == (method, expected.version, UNITS)
    assert (decision.bound.lower, decision.bound.upper, decision.bound.estimate) == \
        (expected.lower, expected.upper, expected.estimate)
    eps = Fraction("0.2")
    answer = Answer.ADMITTED if Fraction(expected.upper) <= eps else \
        Answer.VIOLATED if Fraction(expected.lower) > eps else Answer.UNKNOWN
    assert decision.answer is answer
    assert decision.diagnostics is not None
    assert decision.diagnostics.hoeffding.upper == bounds.hoeffding(c - r, -1.0, 1.0, _delta("0.05")).upper


def test_every_answer_is_reached_and_the_json_validates(cli: InvarSession, tmp_path: Path) -> None:
    ws = _workspace(tmp_path, requirement={"method": "betting", "epsilon": 0.1}, units=60)
    same = _offsets(ws, 3, 2)
    worse = {k: v + (8 if v >= 0 else -8) for k, v in same.items()}  # every candidate loss 0.8 above or capped
    schema = json.loads((REPO_ROOT / "docs" / "schemas" / "use-admit.schema.json").read_text(encoding="utf-8"))
    for name, cand, answer, code in [("same", same, "Admitted", 0), ("worse", worse, "Violated", 10)]:
        run = _run(ws, tmp_path / name, same, cand)
        out = cli.run("use", "admit", run, "--contract", ws.contract_path, "--json")
        assert out.returncode == code, out.stderr
        doc = json.loads(out.stdout)
        jsonschema.Draft202012Validator(schema).validate(doc)
        assert doc["answer"] == answer
        task = doc["task_loss"]
        assert task["loss_range"] == [0.0, 1.0]
        assert Fraction(task["mean_difference"]) == \
            (Fraction(task["candidate_loss"]) - Fraction(task["reference_loss"])) / 60
        assert task["mean_difference_float"] == float(Fraction(task["mean_difference"]))
        assert "mcnemar_exact_one_sided" not in doc["diagnostics"]
        text = cli.run("use", "admit", run, "--contract", ws.contract_path)
        assert text.returncode == code
        assert "task loss  n = 60, losses in [0, 1]: reference " in text.stdout
        assert "bound      betting betting/1" in text.stdout


def test_a_wider_range_is_bounded_on_its_own_span(tmp_path: Path) -> None:
    wide = {"name": "partial.py:loss", "settings": {"loss_range": [0, 10], "binary": False,
                                                    "params": {"scale": 1, "cap": 10}}}
    ws = _workspace(tmp_path, scorer=wide, requirement={"method": "maurer-pontil", "epsilon": 1.5})
    ref, cand = _offsets(ws, 4, 6), _offsets(ws, 5, 6)
    decision = admit(ws.contract_path, _run(ws, tmp_path / "run", ref, cand))
    r, c = _losses(ws, ref, 1, 10), _losses(ws, cand, 1, 10)
    expected = bounds.maurer_pontil(c - r, -10.0, 10.0, _delta("0.05"))
    assert decision.bound is not None
    assert (decision.bound.lower, decision.bound.upper) == (expected.lower, expected.upper)
    assert isinstance(decision.task_loss, RangeTaskLoss)
    assert decision.task_loss.loss_range == (0.0, 10.0)


def test_finite_domain_compares_the_exact_mean_of_float_losses(tmp_path: Path) -> None:
    ws = _workspace(tmp_path, requirement={"standard": "finite-domain", "confidence": None, "method": None,
                                           "epsilon": "0.03"}, units=10)
    ref = {u.unit_id: 0 for u in ws.plan.units}
    cand = {**ref, ws.plan.units[0].unit_id: 3}  # one unit 0.3 worse: mean increase 0.03 exactly (0.3 is not)
    decision = admit(ws.contract_path, _run(ws, tmp_path / "run", ref, cand))
    assert decision.task_loss.mean_difference == Fraction(0.3) / 10
    assert decision.bound is None
    # Fraction(0.3) is just below 3/10, so the exact mean is just below ε = 0.03 and the candidate is admitted.
    assert decision.answer is Answer.ADMITTED
    assert "(compared exactly) ≤ ε = 0.03" in decision.reason


def test_a_receipt_of_a_range_decision_verifies(tmp_path: Path) -> None:
    ws = _workspace(tmp_path, requirement={"method": "hoeffding", "epsilon": 0.3})
    run = _run(ws, tmp_path / "run", _offsets(ws, 6, 2), _offsets(ws, 7, 2))
    decision = admit(ws.contract_path, run)
    write_receipt(tmp_path / "receipt.json", make_receipt(decision, contract=ws.contract_path))
    check = verify_receipt(tmp_path / "receipt.json", run, ws.contract_path, trust_embedded_key=True)
    assert check.decision.task_loss == decision.task_loss
    envelope = json.loads((tmp_path / "receipt.json").read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicate"]["figures"]["task_loss"]["loss_range"] == [0.0, 1.0]


def test_a_sequential_range_contract_stops_where_the_rule_says(tmp_path: Path) -> None:
    ws = _workspace(tmp_path, units=48, execution={"requests_per_call": 16},
                    requirement={"epsilon": 0.2, "method": "betting-sequence", "sequential": True, "max_n": 48})
    same = _offsets(ws, 8, 1)
    assert ws.plan.sequential is not None
    # Write looks until the rule, recomputed here on the losses, stops; admission must find the same stop.
    d = np.zeros(0)
    for looks in range(1, 4):
        used = ws.plan.sequential.look_units(looks)
        d = np.zeros(len(used))  # equal responses: every difference 0
        rule = sequential.sequential_decision("betting-sequence", d, ws.plan.sequential.boundaries, Fraction("0.2"),
                                              _delta("0.05"), 48)
        if rule.answer != "Running":
            break
    writer = RunWriter(ws, tmp_path / "run")
    workers = {"reference": writer.worker("reference"), "candidate": writer.worker("candidate")}
    for look in range(looks):
        for planned in ws.plan.look_calls(look):
            def edit(outputs: list[dict[str, Any]], planned: PlannedCall = planned) -> None:
                for out, req in zip(outputs, planned.params.to_wire()["requests"], strict=True):
                    text = str(answer_of(req["prompt"]) + same[req["request_id"]])
                    out["tokens"] = np.array([*ws.vocab.encode(text), ws.vocab.eos_token_id], dtype=np.int32)
                    out["logprobs"] = -np.ones(len(out["tokens"]), dtype=np.float32)
            writer.generate(workers[planned.package], planned, edit_outputs=edit)
    decision = admit(ws.contract_path, writer.close())
    assert decision.sequential is not None
    assert decision.answer.value == rule.answer
    assert decision.sequential.stop == rule.stop == d.size
    assert decision.bound is not None
    assert (decision.bound.lower, decision.bound.upper) == (rule.final.lower, rule.final.upper)


# --- a scorer that breaks its word ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "message"), [
    ("return 1.5", r"returned 1\.5, outside its declared loss_range \[0\.0, 1\.0\]"),
    ("raise ValueError('no number')", r"raised ValueError: no number; fix the scorer"),
])
def test_a_scorer_out_of_range_or_raising_is_one_line_naming_the_unit(cli: InvarSession, tmp_path: Path, body: str,
                                                                       message: str) -> None:
    ws = _workspace(tmp_path, requirement={"method": "betting"}, units=12)
    (tmp_path / "partial.py").write_text(f"def loss(unit, response, params):\n    {body}\n")
    # The contract pins the first file: prepare a new one over the broken function.
    text = (tmp_path / "decl.toml").read_text().replace('name = "arith-test"', 'name = "arith-broken"')
    (tmp_path / "decl.toml").write_text(text)
    again = prepare(tmp_path / "decl.toml")
    broken = Workspace(ws.root, again.path, again.contract, again.sha256, again.plan, ws.vocab)
    zero = {u.unit_id: 0 for u in broken.plan.units}
    run = _run(broken, tmp_path / "run", zero, zero)
    with RunStore.open(run) as store:
        head = store.verify().head
    out = cli.run("use", "admit", run, "--contract", again.path, "--quiet")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    [line] = out.stderr.strip().splitlines()
    first = broken.plan.units[0].unit_id
    assert f"unit {first!r}" in line
    assert re.search(message, line), line
    with RunStore.open(run) as store:
        assert store.verify().head == head  # the records are kept, unchanged


# --- the bounds on partial-credit differences ----------------------------------------------------------------------


def _partial_credit(rng: np.random.Generator, reps: int, n: int, span: float) -> np.ndarray:
    """Paired differences of partial-credit losses in [0, span]: each package's loss is k/10 of the span with a
    skewed k, the candidate's a little worse; d in [-span, span]."""
    grid = np.arange(11) / 10.0 * span
    ref = rng.choice(grid, size=(reps, n), p=_weights(0.0))
    cand = rng.choice(grid, size=(reps, n), p=_weights(0.15))
    return cand - ref


def _weights(shift: float) -> np.ndarray:
    w = np.exp(-np.arange(11) / (2.0 + 10 * shift))
    return w / w.sum()


def _true_mean(span: float) -> float:
    grid = np.arange(11) / 10.0 * span
    return float(grid @ _weights(0.15) - grid @ _weights(0.0))


@pytest.mark.parametrize("span", [1.0, 10.0])
def test_the_bounds_cover_the_mean_of_partial_credit_differences(span: float) -> None:
    """Each one-sided bound misses E[d] with probability ≤ δ: simulated misses are judged by a one-sided binomial
    test at level 1e-3 (a valid bound fails it with probability ≤ 1e-3). Betting through the vectorised kernel its
    public function wraps, on the same rows."""
    rng = np.random.default_rng(20260401)
    reps, n = 2000, 30
    d = _partial_credit(rng, reps, n, span)
    mean = _true_mean(span)
    a, b = -span, span
    limits = {method: np.array([(x.lower, x.upper) for x in (bounds.bound(method, row, a, b, DELTA)
                                                             for row in d)])
              for method in ("hoeffding", "maurer-pontil")}
    low_x, up_x = bounds.betting_limits_rescaled(bounds.rescale(d, a, b), DELTA)
    limits["betting"] = np.stack(bounds.unscale_limits(low_x, up_x, a, b), axis=1)
    first = bounds.bound("betting", d[0], a, b, DELTA)
    assert limits["betting"][0].tolist() == [first.lower, first.upper]
    for method, got in limits.items():
        for side, missed in (("upper", int((got[:, 1] < mean).sum())), ("lower", int((got[:, 0] > mean).sum()))):
            assert float(stats.binom.sf(missed - 1, reps, DELTA)) >= 1e-3, (method, side, missed)


# --- use plan ------------------------------------------------------------------------------------------------------


def test_use_plan_sizes_a_range_contract_on_the_range_of_its_differences(tmp_path: Path) -> None:
    wide = {"name": "partial.py:loss", "settings": {"loss_range": [0, 10], "binary": False}}
    ws = _workspace(tmp_path / "wide", scorer=wide, requirement={"method": "maurer-pontil", "epsilon": 1.5})
    result = RUNNER.invoke(use.app, ["plan", str(ws.contract_path), "--assume", "variance=4 mean=0", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [row["method"] for row in rows] == ["hoeffding", "maurer-pontil"]
    for row in rows:
        assert row["n"] == plan_row(row["method"], Assumed(variance=4.0, mean=0.0, a=-10.0, b=10.0), 1.5, 0.05).n
        assert "d in [-10, 10]" in row["assumption"]
    refused = RUNNER.invoke(use.app, ["plan", str(ws.contract_path), "--assume", "worse=0.01 better=0.01"])
    assert isinstance(refused.exception, InvarError)
    assert str(refused.exception) == ("--assume worse=/better= describes 0/1 losses, but this contract's differences "
                                      "lie in [-10, 10]; state --assume 'variance=... mean=...' of the difference")
    # Losses in [0, 1]: differences in [-1, 1], where 0/1 losses are one possible distribution.
    unit = _workspace(tmp_path / "unit", requirement={"method": "hoeffding"})
    args = ["plan", str(unit.contract_path), "--assume", "worse=0.01 better=0.01", "--method", "hoeffding", "--json"]
    (row,) = json.loads(RUNNER.invoke(use.app, args).output)["rows"]
    assert row["n"] == plan_row("hoeffding", Assumed(0.01, 0.01), 0.05, 0.05).n


def test_measurements_beside_a_range_decision_leave_the_task_to_the_decision(tmp_path: Path) -> None:
    from test_measurements import write_run  # the plan /3 run writer of the measurements tests

    ws = _workspace(tmp_path, units=12, measurements={"capture_steps": [0, "last"]},
                    requirement={"method": "hoeffding", "epsilon": 0.5})
    decision = admit(ws.contract_path, write_run(ws, tmp_path / "run"))
    assert decision.measurements is not None
    assert decision.measurements.task() is None  # the comparison counts 0/1 losses; task_loss has these
    assert isinstance(decision.task_loss, RangeTaskLoss)
    schema = json.loads((REPO_ROOT / "docs" / "schemas" / "use-admit.schema.json").read_text(encoding="utf-8"))
    printed = decision.output().model_dump(mode="json", exclude_unset=True)
    jsonschema.Draft202012Validator(schema).validate({**printed, "receipt": None})
