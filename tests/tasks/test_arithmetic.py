"""The arithmetic task: answers, the scorer's response format, populations and their disjointness."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from invar.errors import ContractError
from invar.tasks import (
    KINDS,
    MAX_ANSWER_CHARS,
    SCORERS,
    answer_of,
    arithmetic,
    draw,
    load_population,
    population_bytes,
    score,
    split_of,
    stream,
)
from invar.tasks.arithmetic import population

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
EVAL = DATA / "arith-eval.jsonl"
TRAIN = DATA / "arith-train.jsonl"


def declared_digest(path: Path) -> str:
    digest, name = (path.parent / f"{path.stem}.sha256").read_text().split()
    assert name == path.name
    return digest


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("37+58=", 95),
        ("91-46=", 45),
        ("46-91=", -45),
        ("12*7=", 84),
        ("3*4+5=", 17),
        ("5+3*4=", 17),
        ("5-3*4=", -7),
        ("2*3*4-1=", 23),
        ("10-2-3=", 5),
        ("0=", 0),
        ("99+99-99=", 99),
    ],
)
def test_answer_of_follows_precedence_and_left_to_right(prompt: str, answer: int) -> None:
    assert answer_of(prompt) == answer


@pytest.mark.parametrize(
    "prompt", ["", "=", "37+58", "37+=", "+3=", "3++4=", "07+1=", "3/4=", "-3+4=", " 3+4=", "3+4= ", "3+4=5"]
)
def test_malformed_prompt_is_a_contract_error(prompt: str) -> None:
    with pytest.raises(ContractError, match="not an arithmetic problem"):
        answer_of(prompt)


@given(st.integers(0, 999), st.sampled_from("+-*"), st.integers(0, 999), st.sampled_from("+-*"), st.integers(0, 999))
def test_answer_of_matches_python_arithmetic(a: int, op1: str, b: int, op2: str, c: int) -> None:
    expression = f"{a}{op1}{b}{op2}{c}"
    assert answer_of(expression + "=") == eval(expression)  # trusted reference on digits and operators only


@pytest.mark.parametrize(
    ("response", "loss"),
    [
        ("95", 0),
        ("", 1),
        ("96", 1),
        ("095", 1),
        ("+95", 1),
        (" 95", 1),
        ("95 ", 1),
        ("95\n", 1),
        ("9 5", 1),
        ("95</s>", 1),
        ("<s>95", 1),
        ("95.0", 1),
        ("9", 1),
        ("951", 1),
    ],
)
def test_score_accepts_exactly_the_canonical_answer(response: str, loss: int) -> None:
    assert score("37+58=", response) == loss


def test_score_on_negative_and_zero_answers() -> None:
    assert score("46-91=", "-45") == 0
    assert score("46-91=", "45") == 1
    assert score("46-91=", "--45") == 1
    assert score("50-50=", "0") == 0
    assert score("50-50=", "-0") == 1
    assert score("50-50=", "00") == 1


def test_scorers_maps_the_contract_name_to_score() -> None:
    assert {"arithmetic-exact": score} == SCORERS


def test_draw_is_a_pure_function_of_seed_and_index() -> None:
    assert draw(7, 123) == draw(7, 123)
    assert [draw(7, i) for i in range(50)] != [draw(8, i) for i in range(50)]
    # Pinned values: the stream must not change with Python or numpy versions.
    assert [(p.prompt, p.kind) for p in (draw(1, 0), draw(1, 1), draw(2, 0), draw(3, 10**6))] == PINNED_DRAWS


PINNED_DRAWS = [("19+95=", "add2"), ("958+218=", "add3"), ("8*92=", "mul"), ("237+687=", "add3")]


def test_mix_weights_sum_to_100_and_every_kind_occurs() -> None:
    assert sum(k.weight for k in arithmetic._KINDS) == 100
    kinds = Counter(draw(5, i).kind for i in range(5000))
    assert set(kinds) == set(KINDS)
    for kind in arithmetic._KINDS:  # each kind's share within 3 points of its weight
        assert abs(100 * kinds[kind.name] / 5000 - kind.weight) < 3


def test_answers_fit_the_declared_length() -> None:
    lengths = [len(p.answer) for p in (draw(9, i) for i in range(20_000))]
    assert max(lengths) <= MAX_ANSWER_CHARS


def test_split_is_about_half_and_deterministic() -> None:
    prompts = [draw(3, i).prompt for i in range(4000)]
    share = sum(split_of(p) == "eval" for p in prompts) / len(prompts)
    assert 0.45 < share < 0.55
    assert [split_of(p) for p in prompts] == [split_of(p) for p in prompts]


def test_population_is_the_start_of_its_stream() -> None:
    problems = population("eval", 11, 500, id_prefix="x")
    assert [p.prompt for p in problems] == [p.prompt for p in islice(stream("eval", 11), 500)]
    assert [p.id for p in problems[:2]] == ["x-000000", "x-000001"]
    assert len({p.id for p in problems}) == 500
    assert all(split_of(p.prompt) == "eval" for p in problems)
    assert all(score(p.prompt, p.answer) == 0 for p in problems)


def test_shipped_eval_population_matches_its_digest_and_generator() -> None:
    data = EVAL.read_bytes()
    assert hashlib.sha256(data).hexdigest() == declared_digest(EVAL)
    assert data == population_bytes(population("eval", 1, 20_000, id_prefix="eval"))
    problems = load_population(EVAL, declared_digest(EVAL))
    assert len(problems) == 20_000
    kinds = Counter(p.kind for p in problems)
    for kind in arithmetic._KINDS:  # an independent sample: each kind within 1.5 points of its weight
        assert abs(100 * kinds[kind.name] / 20_000 - kind.weight) < 1.5


def test_shipped_train_population_matches_its_digest_and_generator() -> None:
    data = TRAIN.read_bytes()
    assert hashlib.sha256(data).hexdigest() == declared_digest(TRAIN)
    assert data == population_bytes(population("train", 2, 20_000, id_prefix="train"))


def trained_problems() -> int:
    args = json.loads((ROOT / "models" / "tiny-arith" / "training.json").read_text())["args"]
    return int(args["steps"]) * int(args["batch"])


def test_training_never_sees_an_evaluation_prompt() -> None:
    eval_prompts = {p.prompt for p in load_population(EVAL, declared_digest(EVAL))}
    assert all(split_of(p) == "eval" for p in eval_prompts)
    train_file = {p.prompt for p in load_population(TRAIN, declared_digest(TRAIN))}
    assert not eval_prompts & train_file
    # The shipped model's training stream: seed 3, steps x batch problems (models/tiny-arith/training.json).
    trained = {p.prompt for p in islice(stream("train", seed=3), trained_problems())}
    assert not eval_prompts & trained


def test_load_population_rejects_a_wrong_digest(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"sha256 [0-9a-f]{64} but 0{64} was declared"):
        load_population(EVAL, "0" * 64)
    with pytest.raises(ContractError, match="does not exist"):
        load_population(tmp_path / "missing.jsonl", "0" * 64)


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "prompt": "1+1=", "answer": "3"}'], "line 1: answer '3' is not the canonical answer 2"),
        (['{"id": "a", "prompt": "1+1=", "answer": "02"}'], "not the canonical answer"),
        (['{"id": "a", "prompt": "1+1", "answer": "2"}'], "not an arithmetic problem"),
        (['{"id": "a", "prompt": "1+1="}'], "expected an object with keys"),
        (['{"id": "a", "prompt": "1+1=", "answer": "2", "extra": 1}'], "expected an object with keys"),
        (['{"id": 1, "prompt": "1+1=", "answer": "2"}'], "must be strings"),
        (['{"id": "a", "prompt": "1+1=", "answer": "2"}', '{"id": "a", "prompt": "2+2=", "answer": "4"}'],
         "line 2: id 'a' repeats"),
        (["not json"], "line 1 is not JSON"),
        ([], "holds no problems"),
    ],
)
def test_load_population_names_the_bad_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "p.jsonl"
    with pytest.raises(ContractError, match=message):
        load_population(path, write(path, lines))


def test_load_population_reads_ids_prompts_answers(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    digest = write(path, [json.dumps({"id": "a", "prompt": "3*4+5=", "answer": "17"})])
    [problem] = load_population(path, digest.upper())
    assert (problem.id, problem.prompt, problem.answer, problem.kind) == ("a", "3*4+5=", "17", "")
