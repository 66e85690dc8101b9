"""A partial-credit scorer (losses in [0, 1], not 0/1) on the real HF engine and the shipped model, through the CLI:
`use prepare` → `use run` → `use admit` → `use verify`, and `invar evaluate`. Every figure is recomputed here from
the run's records alone: the responses decoded with the model's tokenizer, scored by this file's own copy of the
rule (not the scorer file), and the bounds recomputed with `invar.stats`."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from support.cli_batch import InvarSession
from support.cli_runs import package_lines, toml_value

from invar import canonical
from invar.contract.prepare import load_contract
from invar.engines import DEFAULT_MODEL
from invar.records import RunStore
from invar.stats import bounds
from invar.tasks import ModelTokenizer

pytestmark = pytest.mark.engine

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = REPO_ROOT / "docs" / "schemas"
POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"
UNITS = 20
CLI_BOUND_S = 600  # seconds a command may take in the module's session (tests/cli/conftest.py)

SCORER = '''import re


def loss(unit, response, params):
    """Partial credit: |the first integer in the response - the answer| / 10, capped at 1; no integer is 1."""
    found = re.search(r"-?[0-9]+", response)
    if found is None:
        return 1
    return min(1.0, abs(int(found.group()) - int(unit.answer)) / 10)
'''


def _partial_credit(response: str, answer: str) -> float:
    """The rule of SCORER, written again here so the test does not trust the file it checks."""
    found = re.search(r"-?[0-9]+", response)
    return 1.0 if found is None else min(1.0, abs(int(found.group()) - int(answer)) / 10)


def _validate(name: str, doc: Any) -> None:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(doc)


def _toml(data: Mapping[str, Any]) -> str:
    """A declaration as TOML: top-level scalars, then one table per section (values inline)."""
    value = toml_value
    head = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict) and v != []]
    body = [f"[{k}]\n" + "".join(f"{json.dumps(f)} = {value(x)}\n" for f, x in v.items())
            for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(head) + "\n" + "".join(body)


def _answers() -> dict[str, str]:
    return {row["id"]: row["answer"] for row in map(json.loads, POPULATION.read_text(encoding="utf-8").splitlines())}


def _responses(run: Path, vocab: ModelTokenizer) -> dict[str, dict[str, str]]:
    """The loaded model's quantization → request id → the response text, read from the run's records."""
    out: dict[str, dict[str, str]] = {}
    loaded: dict[str, str] = {}
    with RunStore.open(run) as store:
        for rec in store.calls():
            if rec.report is None or not rec.report.report.ok:
                continue
            if rec.call.method == "load_model":
                loaded[rec.worker] = rec.call.params["quantization"]
            elif rec.call.method == "generate":
                for o in rec.report.report.result["outputs"]:
                    text = vocab.decode([int(t) for t in o["tokens"]])
                    out.setdefault(loaded[rec.worker], {})[o["request_id"]] = text
    return out


def _delta(text: str) -> float:
    x = float(text)
    return math.nextafter(x, 0.0) if Fraction(x) > Fraction(text) else x


def test_a_partial_credit_scorer_through_prepare_run_admit_and_verify(cli: InvarSession, tmp_path: Path) -> None:
    (tmp_path / "partial.py").write_text(SCORER)
    common = package_lines("hf", DEFAULT_MODEL)
    sha = POPULATION.with_suffix(".sha256").read_text().split()[0]
    (tmp_path / "decl.toml").write_text(f'''name = "partial-nf4"
description = "May NF4 weights replace float32, graded by how far the answer is off?"
[population]
path = "{POPULATION}"
sha256 = "{sha}"
sample = {UNITS}
[scorer]
name = "partial.py:loss"
settings = {{ loss_range = [0, 1], binary = false }}
[sampling]
temperature = 1.0
max_tokens = 5
[requirement]
standard = "population"
epsilon = "0.3"
confidence = "0.95"
method = "betting"
[pairing]
seed = 11
layout = "b10"
[layouts.b10]
batch_size = 10
[invariance]
required = false
[reference]
{common}dtype = "float32"
[candidate]
{common}dtype = "float32"
quantization = "nf4"
[[premises]]
statement = "The sample represents the use."
party = "the test"
basis_sha256 = "{sha}"
reliance = "vouched"
''')
    prepared = cli.run("use", "prepare", tmp_path / "decl.toml", "--json")
    assert prepared.returncode == 0, prepared.stderr
    contract = Path(json.loads(prepared.stdout)["contract"])
    ran = cli.run("use", "run", contract, "--run", tmp_path / "run", "--json")
    assert ran.returncode == 0, ran.stderr
    head = json.loads(ran.stdout)["chain_head"]
    admitted = cli.run("use", "admit", tmp_path / "run", "--contract", contract, "--expect-head", head,
                       "--receipt", tmp_path / "receipt.json", "--json")
    assert admitted.returncode in (0, 10, 11), admitted.stderr
    doc = json.loads(admitted.stdout)
    _validate("use-admit", doc)

    # The decision, recomputed from the records: responses decoded, scored by this file's rule, bounded here.
    vocab = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    answers = _answers()
    texts = _responses(tmp_path / "run", vocab)
    _, _, plan = load_contract(contract)
    order = [u.unit_id for u in plan.units]  # betting reads the units in the plan's order
    ref = np.array([_partial_credit(texts["none"][i], answers[i]) for i in order])
    cand = np.array([_partial_credit(texts["nf4"][i], answers[i]) for i in order])
    assert len(order) == UNITS
    assert (set(ref.tolist()) | set(cand.tolist())) - {0.0, 1.0}, "every loss was 0 or 1: no partial credit seen"
    task = doc["task_loss"]
    assert task["loss_range"] == [0.0, 1.0]
    assert Fraction(task["reference_loss"]) == sum(Fraction(x) for x in ref.tolist())
    assert Fraction(task["candidate_loss"]) == sum(Fraction(x) for x in cand.tolist())
    assert (task["worse"], task["better"]) == (int((cand > ref).sum()), int((cand < ref).sum()))
    expected = bounds.betting(cand - ref, -1.0, 1.0, _delta("0.05"), order="plan")
    b = doc["bound"]
    assert (b["method"], b["version"], b["n"]) == ("betting", "betting/1", UNITS)
    assert (b["lower"], b["upper"], b["estimate"]) == (expected.lower, expected.upper, expected.estimate)
    eps = Fraction("0.3")
    answer = "Admitted" if Fraction(expected.upper) <= eps else \
        "Violated" if Fraction(expected.lower) > eps else "Unknown"
    assert doc["answer"] == answer
    print(f"measured: {UNITS} units, mean loss {float(ref.mean()):.3f} (float32) and {float(cand.mean()):.3f} "
          f"(NF4), betting [{expected.lower:.4f}, {expected.upper:.4f}]: {answer}")
    hoeffding = bounds.hoeffding(cand - ref, -1.0, 1.0, _delta("0.05"))
    assert doc["diagnostics"]["hoeffding"]["upper"] == hoeffding.upper

    verified = cli.run("use", "verify", tmp_path / "receipt.json", "--run", tmp_path / "run", "--contract", contract,
                       "--trust-embedded-key", "--json")  # unsigned: nothing else to trust
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["answer"] == answer

    # The scorer file is pinned: a changed one is refused in one line, and the records stay as they were.
    (tmp_path / "partial.py").write_text(SCORER.replace("/ 10", "/ 5"))
    refused = cli.run("use", "admit", tmp_path / "run", "--contract", contract, "--quiet")
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert canonical.file_sha256(tmp_path / "partial.py") in refused.stderr
    with RunStore.open(tmp_path / "run") as store:
        assert store.verify().head == head


def test_evaluate_reports_the_mean_loss_with_a_betting_interval(cli: InvarSession, tmp_path: Path) -> None:
    (tmp_path / "partial.py").write_text(SCORER)
    out = cli.run("evaluate", "--count", "12", "--scorer", f"{tmp_path / 'partial.py'}:loss", "--scorer-setting",
                  "loss_range=[0, 1]", "--run", tmp_path / "eval", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    _validate("evaluate", doc)
    assert "accuracy" not in doc
    answers = _answers()
    vocab = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    [texts] = _responses(tmp_path / "eval", vocab).values()
    ids = sorted(texts)  # the sample runs in population order, and the ids sort that way
    losses = np.array([_partial_credit(texts[i], answers[i]) for i in ids])
    total = sum(Fraction(x) for x in losses.tolist())
    assert (doc["problems"], Fraction(doc["loss_sum"]), doc["mean_loss"]) == (12, total, float(total / 12))
    interval = bounds.betting(losses, 0.0, 1.0, (1.0 - 0.95) / 2.0, order="plan")  # each side at (1 − c)/2
    assert doc["interval"] == [interval.lower, interval.upper]
    assert (doc["interval_method"], doc["interval_version"], doc["loss_range"]) == ("betting", "betting/1", [0, 1])
    assert sum(row["problems"] for row in doc["by_kind"].values()) == 12
    assert interval.lower <= doc["mean_loss"] <= interval.upper
    text = cli.run("evaluate", "--count", "12", "--scorer", f"{tmp_path / 'partial.py'}:loss", "--scorer-setting",
                   "loss_range=[0, 1]", "--run", tmp_path / "eval2")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"mean loss {doc['mean_loss']:.4f} over 12 problems (losses in [0, 1]), 95% "
                                  f"betting interval [{interval.lower:.4f}, {interval.upper:.4f}]")


def test_a_raising_scorer_stops_a_sequential_run_in_one_line_and_keeps_its_records(cli: InvarSession,
                                                                                   tmp_path: Path) -> None:
    """A sequential contract scores during `use run` (the rule looks after each look): a scorer that raises stops
    the run with one line naming the unit, exit 2, and every record so far stays on file."""
    data = tomllib.loads((REPO_ROOT / "contracts" / "arith-fixed-block.toml").read_text(encoding="utf-8"))
    data.update(name="partial-raising", premises=[], layouts={"b8": {"batch_size": 8}}, invariance={"required": False},
                execution={"requests_per_call": 8})
    data["population"] = {**data["population"], "path": str(POPULATION), "sample": 16}
    data["pairing"] = {**data["pairing"], "layout": "b8"}
    for role in ("reference", "candidate"):
        data[role]["model_dir"] = str(DEFAULT_MODEL)
    data["candidate"].pop("patches")
    data["candidate"]["dtype"] = "bfloat16"
    data["candidate"]["settings"] = data["reference"]["settings"]
    data["scorer"] = {"name": "partial.py:loss", "settings": {"loss_range": [0, 1], "binary": False}}
    data["requirement"] = {"standard": "population", "epsilon": "0.2", "confidence": "0.95",
                           "method": "betting-sequence", "sequential": True, "max_n": 16}
    (tmp_path / "partial.py").write_text("def loss(unit, response, params):\n    raise ValueError('no grade')\n")
    (tmp_path / "decl.toml").write_text(_toml(data))
    prepared = cli.run("use", "prepare", tmp_path / "decl.toml", "--json")
    assert prepared.returncode == 0, prepared.stderr
    contract = Path(json.loads(prepared.stdout)["contract"])
    _, _, plan = load_contract(contract)
    assert plan.sequential is not None
    first = plan.units[plan.sequential.look_units(1)[0]].unit_id

    ran = cli.run("use", "run", contract, "--run", tmp_path / "run", "--quiet")  # no phase before the error
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
    [line] = ran.stderr.strip().splitlines()
    assert f"scorer partial.py:loss: unit {first!r}" in line
    assert "raised ValueError: no grade; fix the scorer" in line
    assert f"resume with: invar use run {contract} --run {tmp_path / 'run'}" in line
    with RunStore.open(tmp_path / "run") as store:
        verification = store.verify()
        generated = [c for c in store.calls() if c.call.method == "generate" and c.report is not None]
    assert not verification.closed
    assert len(generated) == 2  # the first look of both packages, answered and kept
