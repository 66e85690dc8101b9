"""`invar use summary`: an imported pair described as `invar evaluate` reports a policy, from the real exports in
tests/imported/data, its counts recomputed here from the files themselves and equal to the decision's; bad input is
one line, exit 2. The command lines run one after another in one process (`cli`, tests/support/cli_batch.py), each as
`python -m invar.cli` runs it in its test's folder: the CLI's start-up once."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.cli_batch import InvarSession

from invar.stats.intervals import clopper_pearson

DATA = Path(__file__).resolve().parent / "data"
SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "use-summary.schema.json"


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    with InvarSession(bound_s=120) as session:
        yield session


def _prepared(cli: InvarSession, folder: Path, imported: str) -> Path:
    (folder / "decl.toml").write_text(f'name = "pair"\n[imported]\n{imported}[requirement]\nstandard = "population"\n'
                                      'epsilon = "0.2"\nconfidence = "0.95"\nmethod = "paired-binary-exact"\n',
                                      encoding="utf-8")
    out = cli.run("use", "prepare", "decl.toml", cwd=folder)
    assert out.returncode == 0, out.stderr
    return folder / "pair.contract.json"


def _summary(cli: InvarSession, folder: Path, *extra: str) -> dict[str, Any]:
    out = cli.run("use", "summary", "pair.contract.json", "--json", *extra, cwd=folder)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text(encoding="utf-8")))
    return doc


def test_lm_eval_pair_as_evaluate_reports_it(cli: InvarSession, tmp_path: Path) -> None:
    """The real lm-eval samples against a copy in which every fifth item's score is flipped: each side's accuracy and
    interval, and the paired table, as the two files say, and the same counts as the decision's."""
    rows = [json.loads(line) for line in (DATA / "lm-eval-samples.jsonl").read_text(encoding="utf-8").splitlines()]
    (tmp_path / "reference.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for i, r in enumerate(rows):
        if i % 5 == 0:
            r["exact_match"] = 1.0 - r["exact_match"]
    (tmp_path / "candidate.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    _prepared(cli, tmp_path, 'format = "lm-eval"\nmetric = "exact_match"\nreference = { path = "reference.jsonl" }\n'
                             'candidate = { path = "candidate.jsonl" }\n')
    doc = _summary(cli, tmp_path)
    ref = {r["doc_id"]: int(r["exact_match"]) for r in
           map(json.loads, (tmp_path / "reference.jsonl").read_text(encoding="utf-8").splitlines())}
    cand = {r["doc_id"]: int(r["exact_match"]) for r in rows}
    for side, scores in zip(doc["sides"], (ref, cand), strict=True):
        right = sum(scores.values())
        assert (side["items"], side["correct"], side["mean_score"]) == (len(scores), right, right / len(scores))
        assert side["interval"] == list(clopper_pearson(right, len(scores), 0.95))
    worse = sum(ref[k] > cand[k] for k in ref)
    better = sum(ref[k] < cand[k] for k in ref)
    assert worse > 0
    assert doc["paired"] == {"items": len(ref), "worse": worse, "better": better, "ties": len(ref) - worse - better,
                             "both_right": sum(ref[k] == cand[k] == 1 for k in ref),
                             "both_wrong": sum(ref[k] == cand[k] == 0 for k in ref),
                             "mean_increase": (worse - better) / len(ref)}
    decided = cli.run("use", "admit", "--contract", "pair.contract.json", "--json", cwd=tmp_path)
    task_loss = json.loads(decided.stdout)["task_loss"]
    assert (task_loss["worse"], task_loss["better"], task_loss["n"]) == (worse, better, len(ref))
    contract = json.loads((tmp_path / "pair.contract.json").read_text(encoding="utf-8"))
    assert [(e["role"], e["sha256"], e["items"], e["exporter"]) for e in doc["exports"]] == [
        (role, contract["exports"][role]["sha256"], len(ref), "lm-evaluation-harness")
        for role in ("reference", "candidate")]
    assert doc["evidence"] == "imported"
    text = cli.run("use", "summary", "pair.contract.json", "--confidence", "0.99", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lo, hi = clopper_pearson(sum(ref.values()), len(ref), 0.99)
    assert f"reference  accuracy {sum(ref.values()) / len(ref):.4f} ({sum(ref.values())}/{len(ref)}), 99% " \
           f"Clopper–Pearson interval [{lo:.4f}, {hi:.4f}]" in text.stdout
    assert f"candidate worse on {worse}, better on {better}" in text.stdout


def test_inspect_log_names_its_harness_and_version(cli: InvarSession, tmp_path: Path) -> None:
    log = DATA / "inspect-log.eval"
    _prepared(cli, tmp_path, f'format = "inspect"\nmetric = "exact"\nreference = {{ path = "{log}" }}\n'
                             f'candidate = {{ path = "{log}" }}\n')
    doc = _summary(cli, tmp_path)
    assert {e["exporter"] for e in doc["exports"]} == {"inspect_ai 0.3.285"}
    assert doc["paired"]["worse"] == doc["paired"]["better"] == 0
    assert doc["sides"][0] == {**doc["sides"][1], "role": "reference"}


def test_graded_table_reports_mean_loss_with_the_betting_interval(cli: InvarSession, tmp_path: Path) -> None:
    with (tmp_path / "losses.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "reference_loss", "candidate_loss"])
        writer.writerows((f"u{i}", i % 4 / 4, (i + 1) % 4 / 4) for i in range(40))
    (tmp_path / "decl.toml").write_text('name = "pair"\n[imported]\nformat = "table"\nloss = "identity"\n'
                                        'loss_range = [0.0, 1.0]\ntable = { path = "losses.csv" }\n[requirement]\n'
                                        'standard = "population"\nepsilon = "0.2"\nconfidence = "0.95"\n'
                                        'method = "betting"\n', encoding="utf-8")
    assert cli.run("use", "prepare", "decl.toml", cwd=tmp_path).returncode == 0
    doc = _summary(cli, tmp_path)
    ref, cand = doc["sides"]
    assert (ref["mean_loss"], cand["mean_loss"], ref["mean_score"], ref["correct"]) == (0.375, 0.375, None, None)
    assert ref["interval_method"] == "betting"
    assert ref["interval"][0] < 0.375 < ref["interval"][1]
    assert (doc["paired"]["worse"], doc["paired"]["better"], doc["paired"]["both_right"]) == (30, 10, None)
    assert [e["role"] for e in doc["exports"]] == ["table"]


@pytest.mark.parametrize("case", ["recorded", "changed", "confidence", "missing"])
def test_bad_input_is_one_line(cli: InvarSession, tmp_path: Path, case: str) -> None:
    samples = DATA / "lm-eval-samples.jsonl"
    (tmp_path / "reference.jsonl").write_bytes(samples.read_bytes())
    contract = _prepared(cli, tmp_path, f'format = "lm-eval"\nmetric = "exact_match"\nreference = {{ path = '
                                        f'"reference.jsonl" }}\ncandidate = {{ path = "{samples}" }}\n')
    args: list[str | Path] = [contract]
    if case == "recorded":
        args = [DATA / "README.md"]
    elif case == "changed":
        with (tmp_path / "reference.jsonl").open("a", encoding="utf-8") as f:
            f.write("\n")
    elif case == "confidence":
        args += ["--confidence", "1"]
    else:
        args = [tmp_path / "nowhere.contract.json"]
    before = sorted(p.name for p in tmp_path.iterdir())
    out = cli.run("use", "summary", *args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
