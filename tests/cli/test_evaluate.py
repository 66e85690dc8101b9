"""`invar evaluate`: its pure parts (interval, seeds, sample) and the real command on the shipped model."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from support.cli_batch import InvarSession

from invar.errors import ContractError
from invar.records import RunStore
from invar.runner.evaluate import request_seed, sample_indices, summarize, summarize_range
from invar.stats.bounds import betting
from invar.stats.intervals import clopper_pearson
from invar.tasks import ModelTokenizer, Problem, score

CLI_BOUND_S = 900  # seconds a command may take in the module's session (tests/cli/conftest.py)


def test_clopper_pearson_matches_closed_forms() -> None:
    # At the edges the exact interval has a closed form: (α/2)^(1/n).
    assert clopper_pearson(0, 10, 0.95) == (0.0, pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-12))
    assert clopper_pearson(10, 10, 0.95) == (pytest.approx(0.025 ** (1 / 10), abs=1e-12), 1.0)
    lo, hi = clopper_pearson(5, 10, 0.95)
    assert lo == pytest.approx(0.187086, abs=1e-6)
    assert hi == pytest.approx(1 - lo, abs=1e-12)
    lo, hi = clopper_pearson(1500, 2000, 0.95)
    assert lo < 0.75 < hi
    assert hi - lo < 0.04
    with pytest.raises(ValueError, match="correct"):
        clopper_pearson(11, 10, 0.95)


def test_request_seeds_are_per_problem_and_stable() -> None:
    assert request_seed(0, "eval-000000") == request_seed(0, "eval-000000")
    seeds = {request_seed(s, f"eval-{i:06d}") for s in (0, 1) for i in range(1000)}
    assert len(seeds) == 2000
    assert all(0 <= s < 2**63 for s in seeds)


def test_a_seeded_sample_is_distinct_sorted_and_reproducible() -> None:
    assert sample_indices(5, None, 0) == [0, 1, 2, 3, 4]
    a = sample_indices(1000, 50, 1)
    assert a == sample_indices(1000, 50, 1)
    assert a == sorted(set(a))
    assert len(a) == 50
    assert a != sample_indices(1000, 50, 2)
    with pytest.raises(ContractError, match="ask for 1 to 1000"):
        sample_indices(1000, 1001, 0)


def test_summarize_counts_by_kind() -> None:
    problems = [Problem(f"p{i}", "1+1=", "2", "add2" if i % 2 else "mul") for i in range(4)]
    out = summarize(problems, [0, 1, 0, 0], 0.95)
    assert out["correct"] == 3
    assert out["accuracy"] == 0.75
    assert out["by_kind"] == {"add2": {"problems": 2, "correct": 1}, "mul": {"problems": 2, "correct": 2}}


def test_summarize_range_reports_the_exact_mean_loss_and_a_betting_interval() -> None:
    problems = [Problem(f"p{i}", "1+1=", "2", "add2" if i % 2 else "mul") for i in range(6)]
    losses = [0.1, 0.3, 0.0, 1.0, 0.2, 0.7]
    out = summarize_range(problems, losses, 0.9, (0.0, 1.0))
    total = sum(Fraction(x) for x in losses)
    assert (out["problems"], Fraction(out["loss_sum"]), out["mean_loss"]) == (6, total, float(total / 6))
    interval = betting(losses, 0.0, 1.0, (1.0 - 0.9) / 2.0, order="plan")
    assert out["interval"] == [interval.lower, interval.upper]
    assert (out["interval_method"], out["interval_version"], out["loss_range"]) == ("betting", "betting/1", [0, 1])
    assert out["by_kind"] == {"add2": {"problems": 3, "mean_loss": float((Fraction(0.3) + 1 + Fraction(0.7)) / 3)},
                              "mul": {"problems": 3, "mean_loss": float((Fraction(0.1) + Fraction(0.2)) / 3)}}
    assert "accuracy" not in out


def _recount(run: Path, model: Path) -> int:
    """The number right, recomputed from the run's records alone (the core's decoding and scorer)."""
    vocab = ModelTokenizer.from_model_dir(model)
    right = 0
    with RunStore.open(run) as store:
        for c in store.calls():
            if c.call.method != "generate":
                continue
            assert c.report is not None
            assert c.report.report.result is not None
            for req, out in zip(c.call.params["requests"], c.report.report.result["outputs"], strict=True):
                right += 1 - score(req["prompt"], vocab.decode(out["tokens"]))
    return right


@pytest.mark.engine
def test_evaluate_a_sample_and_recompute_it_from_the_records(cli: InvarSession, tmp_path: Path, model: Path) -> None:
    run = tmp_path / "run"
    out = cli.run("evaluate", "--count", "96", "--sample-seed", "3", "--batch-size", "32", "--model", str(model),
                  "--run", str(run), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["problems"] == 96
    assert doc["interval_method"] == "clopper-pearson"
    assert doc["accuracy"] == doc["correct"] / 96
    lo, hi = doc["interval"]
    assert lo <= doc["accuracy"] <= hi
    assert _recount(run, model) == doc["correct"]
    with RunStore.open(run) as store:
        assert store.meta()["evaluation"]["correct"] == doc["correct"]
        assert [c.call.method for c in store.calls()].count("generate") == 3


@pytest.mark.engine
@pytest.mark.slow
def test_evaluate_2000_problems(cli: InvarSession, tmp_path: Path, model: Path) -> None:
    run = tmp_path / "run"
    out = cli.run("evaluate", "--count", "2000", "--model", str(model), "--run", str(run))
    assert out.returncode == 0, out.stderr
    print("\n" + out.stdout)
    assert out.stdout.startswith("accuracy ")
    with RunStore.open(run) as store:
        evaluation = store.meta()["evaluation"]
    assert evaluation["problems"] == 2000
    assert _recount(run, model) == evaluation["correct"]


@pytest.mark.engine
def test_evaluate_responses_lists_each_units_response_score_and_answer(cli: InvarSession, tmp_path: Path,
                                                                       model: Path) -> None:
    # A population that scores badly is read here, unit by unit, not by opening the run's database.
    run = tmp_path / "run"
    out = cli.run("evaluate", "--count", "6", "--sample-seed", "1", "--model", str(model), "--run", str(run),
                  "--json", "--responses")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["responses"]
    assert len(rows) == 6
    assert sum(r["loss"] for r in rows) == doc["problems"] - doc["correct"]
    vocab = ModelTokenizer.from_model_dir(model)
    lines = {json.loads(line)["id"]: json.loads(line) for line in Path(doc["population"]).read_text().splitlines()}
    with RunStore.open(run) as store:
        sent = [(req, o) for c in store.calls() if c.call.method == "generate"
                for req, o in zip(c.call.params["requests"], c.report.report.result["outputs"], strict=True)]  # type: ignore[union-attr,index]
    for r, (req, o) in zip(rows, sent, strict=True):
        assert r["unit_id"] == req["request_id"]
        assert r["answer"] == lines[r["unit_id"]]["answer"]
        assert r["prompt"] == lines[r["unit_id"]]["prompt"] == req["prompt"]
        assert r["prompt_ids"] == [int(t) for t in req["prompt_ids"]]
        assert r["tokens"] == o["tokens"].tolist()
        assert r["response"] == vocab.decode(o["tokens"])
        assert r["loss"] == score(r["prompt"], r["response"])
    text = cli.run("evaluate", "--count", "6", "--sample-seed", "1", "--model", str(model), "--run",
                   str(tmp_path / "again"), "--responses")
    assert text.returncode == 0, text.stderr
    for r in rows:
        assert (f"[{r['unit_id']}] loss {r['loss']:g}  expected {json.dumps(r['answer'])}  answered "
                f"{json.dumps(r['response'])}") in text.stdout
