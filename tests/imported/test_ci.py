"""Imported decisions from a plain table, their three answers as CI reads them (exit status, a JUnit file valid under
the JUnit schema CI systems use, the job summary), and the methods a recorded decision uses: graded losses, the finite
domain, sequential looks in the export's order."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import xmlschema

from invar.contract.decide import conservative_delta
from invar.imported import admit_imported, prepare_imported
from invar.stats.bounds import bound
from invar.stats.sequential import sequential_decision

SCHEMA = xmlschema.XMLSchema(Path(__file__).with_name("JUnit.xsd"))


def _table(path: Path, ref: list[float], cand: list[float]) -> None:
    path.write_text("".join(json.dumps({"id": f"item-{i}", "reference_loss": r, "candidate_loss": c}) + "\n"
                            for i, (r, c) in enumerate(zip(ref, cand, strict=True))), encoding="utf-8")


def _declare(folder: Path, name: str, requirement: str, imported: str = "") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\n[imported]\nformat = "table"\nloss = "identity"\n{imported}'
                    f'table = {{ path = "losses.jsonl" }}\n[requirement]\n{requirement}', encoding="utf-8")
    return path


POPULATION = 'standard = "population"\nepsilon = "0.05"\nconfidence = "0.95"\nmethod = "paired-binary-exact"\n'


def _binary(n: int, worse: int, better: int) -> tuple[list[float], list[float]]:
    """n items, `worse` of them lost by the candidate only, `better` won by it only, spread through the order."""
    ref, cand = [0.0] * n, [0.0] * n
    order = np.random.default_rng(1).permutation(n)
    for i in order[:worse]:
        cand[i] = 1.0
    for i in order[worse:worse + better]:
        ref[i] = 1.0
    return ref, cand


@pytest.mark.parametrize(("worse", "answer", "status"), [(2, "Admitted", 0), (90, "Violated", 10),
                                                          (30, "Unknown", 11)])
def test_each_answer_reaches_ci(tmp_path: Path, worse: int, answer: str, status: int) -> None:
    _table(tmp_path / "losses.jsonl", *_binary(600, worse, 0))
    _declare(tmp_path, "gate", POPULATION)
    assert prepare_imported(tmp_path / "gate.toml").contract.exports["table"].items == 600
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "invar.cli", "use", "admit", "--contract", "gate.contract.json",
                          "--junit", "junit.xml", "--summary", str(summary)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == status, out.stderr
    assert out.stdout.startswith(f"{answer}: ")
    assert "evidence   imported from table exports" in out.stdout
    SCHEMA.validate(tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    (case,) = suite.iter("testcase")
    assert case.get("name") == "gate"
    failure = case.find("failure")
    decision = admit_imported(tmp_path / "gate.contract.json")
    b = decision.bound
    assert b is not None
    if answer == "Admitted":
        assert failure is None
        assert suite.get("failures") == "0"
    else:
        assert failure is not None
        assert failure.get("type") == answer
        assert f"bound [{b.lower:.6g}, {b.upper:.6g}]" in (failure.text or "")
        assert "ε = 0.05" in (failure.text or "")
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("earlier step\n")  # appended, as GitHub's step summary expects
    assert f"`gate`: {answer}" in text
    assert f"[{b.lower:.6g}, {b.upper:.6g}]" in text
    assert "```text\n" in text  # the plot


def test_binary_table_decides_with_the_core_bound(tmp_path: Path) -> None:
    ref, cand = _binary(400, 5, 3)
    _table(tmp_path / "losses.jsonl", ref, cand)
    _declare(tmp_path, "binary", POPULATION)
    prepare_imported(tmp_path / "binary.toml")
    d = admit_imported(tmp_path / "binary.contract.json")
    delta = conservative_delta(Decimal("0.05"))  # δ as the decision takes it: never above the declared one
    expected = bound("paired-binary-exact", np.array(cand) - np.array(ref), -1.0, 1.0, delta)
    assert d.bound is not None
    assert (d.bound.lower, d.bound.upper) == (expected.lower, expected.upper)
    assert (d.task_loss.worse, d.task_loss.better, d.task_loss.n) == (5, 3, 400)
    assert d.output().evidence == "imported"
    assert d.premises[0].party == "the table's author"


def test_csv_table_and_graded_losses_use_a_range_method(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    ref = rng.uniform(0, 1, 300).round(3)
    cand = np.clip(ref + rng.normal(0.0, 0.05, 300), 0, 1).round(3)
    (tmp_path / "losses.jsonl").write_text(
        "id,reference_loss,candidate_loss\n" + "".join(f"q{i},{r},{c}\n" for i, (r, c) in enumerate(zip(ref, cand,
                                                                                                          strict=True))),
        encoding="utf-8")
    _declare(tmp_path, "graded", 'standard = "population"\nepsilon = "0.1"\nconfidence = "0.9"\nmethod = "betting"\n',
             "loss_range = [0.0, 1.0]\n")
    prepare_imported(tmp_path / "graded.toml")
    d = admit_imported(tmp_path / "graded.contract.json")
    expected = bound("betting", cand - ref, -1.0, 1.0, 0.09999999999999999)
    assert d.bound is not None
    assert (d.bound.lower, d.bound.upper) == (expected.lower, expected.upper)
    assert d.answer.value == "Admitted"


def test_finite_domain_is_exact_on_the_items(tmp_path: Path) -> None:
    _table(tmp_path / "losses.jsonl", *_binary(40, 3, 1))
    _declare(tmp_path, "finite", 'standard = "finite-domain"\nepsilon = "0.05"\n')
    prepare_imported(tmp_path / "finite.toml")
    d = admit_imported(tmp_path / "finite.contract.json")
    assert d.answer.value == "Admitted"  # 2/40 = 0.05 ≤ ε exactly
    assert "1/20" in d.reason


def test_sequential_looks_in_the_export_order(tmp_path: Path) -> None:
    ref, cand = _binary(2000, 4, 2)
    _table(tmp_path / "losses.jsonl", ref, cand)
    requirement = ('standard = "population"\nepsilon = "0.05"\nconfidence = "0.95"\n'
                   'method = "paired-binary-sequence"\nsequential = true\n')
    _declare(tmp_path, "unordered", requirement)
    with pytest.raises(Exception, match="sampling order"):
        prepare_imported(tmp_path / "unordered.toml")
    _declare(tmp_path, "seq", requirement, 'order = "sampling"\nlook_every = 200\n')
    prepare_imported(tmp_path / "seq.toml")
    d = admit_imported(tmp_path / "seq.contract.json")
    d_values = np.array(cand) - np.array(ref)
    expected = sequential_decision("paired-binary-sequence", d_values, list(range(200, 2001, 200)), Decimal("0.05"),
                                   0.049999999999999996, 2000)
    assert d.sequential is not None
    assert (d.sequential.answer, d.sequential.stop) == (expected.answer, expected.stop)
    assert d.answer.value == expected.answer == "Admitted"
    assert expected.stop < 2000  # stopped at an earlier look


def test_plan_uses_the_items_the_exports_pair(tmp_path: Path) -> None:
    _table(tmp_path / "losses.jsonl", *_binary(500, 3, 2))
    _declare(tmp_path, "planned", POPULATION)
    prepare_imported(tmp_path / "planned.toml")
    out = subprocess.run([sys.executable, "-m", "invar.cli", "use", "plan", "planned.contract.json", "--assume",
                          "worse=0.01 better=0.005", "--method", "hoeffding", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["contract_units"] == 500
    (row,) = plan["rows"]
    assert row["method"] == "hoeffding"
    assert plan["underpowered"] == (plan["contract_power"] < 0.8)
