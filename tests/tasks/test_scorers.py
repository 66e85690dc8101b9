"""Scorers: settings, normalisation, extraction rules, the arithmetic wrapper and pinned user scorers."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.errors import ContractError
from invar.tasks import arithmetic
from invar.tasks.population import Unit, load_units
from invar.tasks.scorers import (
    BUILTIN_SCORERS,
    Choice,
    Scorer,
    ScorerError,
    check_units,
    is_binary,
    load_scorer,
    loss_range,
    losses,
    number_pattern,
    scorer_identity,
)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(".")


def unit(answer: Any, uid: str = "u1", prompt: str | None = "q", line: int = 0) -> Unit:
    return Unit(id=uid, prompt=prompt, messages=None, answer=answer, line=line)


def scorer(name: str, **settings: Any) -> Scorer:
    return load_scorer(name, settings, HERE)


def loss(name: str, answer: Any, response: str, **settings: Any) -> float:
    return scorer(name, **settings).loss(unit(answer), response)


# -- the registry and settings --------------------------------------------------------------------------------------

def test_builtin_names_and_unknown_name() -> None:
    assert list(BUILTIN_SCORERS) == ["exact-match", "numeric", "regex", "choice", "contains", "arithmetic-exact"]
    with pytest.raises(ContractError, match=r"scorer 'bleu' is unknown: use one of exact-match, numeric, regex, "
                                            r"choice, contains, arithmetic-exact, or 'path\.py:function'"):
        scorer("bleu")
    with pytest.raises(ContractError, match="is unknown"):
        scorer("score.txt:f")


def test_builtins_are_binary_with_range_0_1_and_take_no_pin() -> None:
    for name, settings_ in [("exact-match", {}), ("numeric", {}), ("regex", {"pattern": "x"}),
                            ("choice", {"options": ["A", "B"]}), ("contains", {}), ("arithmetic-exact", {})]:
        s = load_scorer(name, settings_, HERE)
        assert s.binary
        assert s.is_binary
        assert is_binary(s)
        assert s.loss_range == loss_range(s) == (0.0, 1.0)
        assert s.version == "1"
        with pytest.raises(ContractError, match=f"scorer {name} is built in and has no file to pin"):
            load_scorer(name, settings_, HERE, "0" * 64)


def test_unknown_setting_lists_the_valid_ones() -> None:
    with pytest.raises(ContractError, match="scorer exact-match: unknown setting 'casefold'; the settings of "
                                            "exact-match are strip, case_fold, collapse_whitespace, strip_punctuation"):
        scorer("exact-match", casefold=True)
    with pytest.raises(ContractError, match="scorer arithmetic-exact: unknown setting 'x'; arithmetic-exact takes no "
                                            "settings"):
        scorer("arithmetic-exact", x=1)


@pytest.mark.parametrize(
    ("name", "settings_", "message"),
    [
        ("exact-match", {"strip": "yes"}, "setting strip: Input should be a valid boolean"),
        ("exact-match", {"strip": 1}, "setting strip: Input should be a valid boolean"),
        ("numeric", {"which": "middle"}, "setting which: Input should be 'first' or 'last'"),
        ("numeric", {"abs_tol": -0.1}, "setting abs_tol: Input should be greater than or equal to 0"),
        ("numeric", {"rel_tol": math.nan}, "setting rel_tol: Input should be a finite number"),
        ("numeric", {"abs_tol": "0.1"}, "setting abs_tol: Input should be a valid number"),
        ("regex", {}, "setting pattern: Field required"),
        ("regex", {"pattern": "x", "group": True}, "setting group"),
        ("choice", {}, "setting options: Field required"),
        ("choice", {"options": ["A"]}, "setting options: List should have at least 2 items"),
        ("choice", {"options": ["A", 2]}, r"setting options\.1: Input should be a valid string"),
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(name: str, settings_: dict[str, Any], message: str) -> None:
    with pytest.raises(ContractError, match=f"scorer {name}: {message}") as info:
        load_scorer(name, settings_, HERE)
    assert "\n" not in str(info.value)


def test_identity_holds_every_setting_with_defaults() -> None:
    assert scorer_identity(scorer("exact-match")) == {
        "name": "exact-match", "version": "1",
        "settings": {"strip": True, "case_fold": False, "collapse_whitespace": False, "strip_punctuation": False},
    }
    assert scorer_identity(scorer("numeric", abs_tol=1))["settings"] == {
        "which": "last", "abs_tol": 1.0, "rel_tol": 0.0, "thousands": False}
    assert scorer_identity(scorer("regex", pattern=r"(\d+)"))["settings"]["group"] == 1
    assert scorer_identity(scorer("regex", pattern=r"\d+"))["settings"]["group"] == 0
    assert scorer_identity(scorer("arithmetic-exact")) == {"name": "arithmetic-exact", "version": "1", "settings": {}}


# -- exact-match and contains ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("answer", "response", "settings_", "expected"),
    [
        ("Paris", "Paris", {}, 0.0),
        ("Paris", "  Paris\n", {}, 0.0),
        ("Paris", "  Paris\n", {"strip": False}, 1.0),
        ("Paris", "paris", {}, 1.0),
        ("Paris", "PARIS", {"case_fold": True}, 0.0),
        ("straße", "STRASSE", {"case_fold": True}, 0.0),
        ("New York", "New   \t York", {}, 1.0),
        ("New York", "New   \t York", {"collapse_whitespace": True}, 0.0),
        ("Paris", "Paris.", {}, 1.0),
        ("Paris", "«Paris»!", {"strip_punctuation": True}, 0.0),
        ("$5", "$5.", {"strip_punctuation": True}, 0.0),  # $ is a symbol, not punctuation
        ("5", "$5", {"strip_punctuation": True}, 1.0),
        ("a b", "a , b", {"strip_punctuation": True, "collapse_whitespace": True}, 0.0),
        ("", "", {}, 0.0),
        ("", "   ", {}, 0.0),
        ("x", "", {}, 1.0),
        ("café", "cafe\u0301", {}, 1.0),  # no Unicode normalisation: composed and decomposed differ
        ("日本", " 日本 ", {}, 0.0),
        (["Paris", "paris, France"], "paris, France", {}, 0.0),
        (["Paris", "Lyon"], "Marseille", {}, 1.0),
    ],
)
def test_exact_match(answer: Any, response: str, settings_: dict[str, Any], expected: float) -> None:
    assert loss("exact-match", answer, response, **settings_) == expected


@pytest.mark.parametrize(
    ("answer", "response", "settings_", "expected"),
    [
        ("Paris", "It is Paris.", {}, 0.0),
        ("Paris", "It is paris.", {}, 1.0),
        ("Paris", "It is PARIS.", {"case_fold": True}, 0.0),
        (["Lyon", "Paris"], "It is Paris.", {}, 0.0),
        ("New York", "in New\nYork", {"collapse_whitespace": True}, 0.0),
        ("New York", "in New\nYork", {}, 1.0),
        ("x", "", {}, 1.0),
    ],
)
def test_contains(answer: Any, response: str, settings_: dict[str, Any], expected: float) -> None:
    assert loss("contains", answer, response, **settings_) == expected


def test_contains_refuses_an_answer_empty_after_normalisation() -> None:
    s = scorer("contains", strip_punctuation=True)
    with pytest.raises(ScorerError, match=r"scorer contains: unit 'u7' \(line 4\): an answer is empty after "
                                          "normalisation"):
        check_units(s, [unit("x"), unit("...", uid="u7", line=4)])


@pytest.mark.parametrize("name", ["exact-match", "contains", "regex"])
@pytest.mark.parametrize("answer", [3, None, [], ["a", 1], {"a": "b"}, True])
def test_text_scorers_refuse_non_text_answers(name: str, answer: Any) -> None:
    s = load_scorer(name, {"pattern": "(x)"} if name == "regex" else {}, HERE)
    with pytest.raises(ScorerError, match=f"scorer {name}: unit 'bad': answer .* is not a string or a non-empty list "
                                          "of strings"):
        check_units(s, [unit("ok"), unit(answer, uid="bad")])
    with pytest.raises(ScorerError, match="unit 'bad'"):
        s.loss(unit(answer, uid="bad"), "x")


@settings(max_examples=80, deadline=None)
@given(answer=st.text(), pad=st.text(" \t\n", max_size=3))
def test_exact_match_accepts_the_answer_itself_padded(answer: str, pad: str) -> None:
    s = scorer("exact-match", collapse_whitespace=True, case_fold=True, strip_punctuation=True)
    assert s.loss(unit(answer), pad + answer + pad) == 0.0
    assert scorer("exact-match", strip=False).loss(unit(answer), answer) == 0.0


# -- numeric --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("answer", "response", "settings_", "expected"),
    [
        ("42", "42", {}, 0.0),
        (42, "The answer is 42.", {}, 0.0),
        (42, "6 * 7 = 42", {}, 0.0),
        (42, "42 is 6 * 7", {}, 1.0),
        (42, "42 is 6 * 7", {"which": "first"}, 0.0),
        (-3, "x = -3", {}, 0.0),
        (-3, "x=-3", {}, 0.0),
        (3, "10-3", {}, 0.0),  # a sign right after a digit is an operator
        (-3, "10-3", {}, 1.0),
        (3, "+3", {}, 0.0),
        (2.5, "about 2.5", {}, 0.0),
        (2.5, "about 2.50", {}, 0.0),
        ("2.50", "2.5", {}, 0.0),
        (0.1, "0.1", {}, 0.0),  # the decimal the file wrote, not the nearest binary float
        (0.5, ".5", {}, 1.0),  # no leading-dot decimals: reads 5
        (5, "Total: 5.", {}, 0.0),
        (1000, "1,000", {}, 1.0),  # reads 1 and 000
        (0, "1,000", {}, 0.0),
        (1, "1,000", {"which": "first"}, 0.0),
        (1000, "1,000", {"thousands": True}, 0.0),
        ("1,000", "costs 1,000.50 total", {"thousands": True, "abs_tol": 0.5}, 0.0),
        (1234567, "12,34,567", {"thousands": True}, 1.0),
        (1, "1,0000", {"thousands": True, "which": "first"}, 0.0),
        (10, "9.9", {"abs_tol": 0.1}, 0.0),
        (10, "9.89", {"abs_tol": 0.1}, 1.0),
        (100, "99", {"rel_tol": 0.01}, 0.0),
        (100, "98.9", {"rel_tol": 0.01}, 1.0),
        (12345678901234567891, "12345678901234567890", {}, 1.0),  # no float rounding
        (12345678901234567890, "12345678901234567890", {}, 0.0),
        (7, "no number here", {}, 1.0),
        (7, "", {}, 1.0),
        (7, "٧", {}, 1.0),  # only ASCII digits
        (7, "−7", {}, 0.0),  # U+2212 is not a sign: reads 7
        (-7, "−7", {}, 1.0),
        (1, "9" * 5000, {}, 1.0),  # past the digit limit: no number read
        (0, "-0", {}, 0.0),
    ],
)
def test_numeric(answer: Any, response: str, settings_: dict[str, Any], expected: float) -> None:
    assert loss("numeric", answer, response, **settings_) == expected


@pytest.mark.parametrize("answer", ["forty-two", "1,000", "1e3", "", True, None, [1], math.inf, math.nan])
def test_numeric_refuses_answers_that_are_not_numbers(answer: Any) -> None:
    s = scorer("numeric")
    with pytest.raises(ScorerError, match=r"scorer numeric: unit 'n' \(line 9\): answer .* is not a finite number"):
        s.check(unit(answer, uid="n", line=9))


def test_number_pattern_reads_signed_decimals() -> None:
    assert number_pattern(False).findall("a-1 b+2.5 3-4 5.6.7 1,234") == ["-1", "+2.5", "3", "4", "5.6", "7", "1",
                                                                         "234"]
    assert number_pattern(True).findall("1,234,567.8 and 12,3456") == ["1,234,567.8", "12", "3456"]


@settings(max_examples=100, deadline=None)
@given(value=st.integers(-(10**30), 10**30), before=st.text(alphabet="abc xyz:=\n", max_size=8),
       after=st.text(alphabet="abc .!", max_size=5))
def test_numeric_reads_any_integer_in_text(value: int, before: str, after: str) -> None:
    assert scorer("numeric").loss(unit(value), f"{before} {value}{after}") == 0.0
    assert scorer("numeric").loss(unit(value + 1), f"{before} {value}{after}") == 1.0


@settings(max_examples=100, deadline=None)
@given(value=st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda x: "e" not in repr(x)))
def test_numeric_reads_floats_as_written(value: float) -> None:
    assert scorer("numeric").loss(unit(value), f"= {value!r}") == 0.0


# -- regex ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("settings_", "answer", "response", "expected"),
    [
        ({"pattern": r"Answer: (\w+)"}, "Paris", "Answer: Paris", 0.0),
        ({"pattern": r"Answer: (\w+)"}, "Paris", "Answer: Lyon. Answer: Paris", 1.0),  # the first match
        ({"pattern": r"Answer: (\w+)"}, "Paris", "no marker", 1.0),
        ({"pattern": r"Answer: (\w+)"}, "paris", "Answer: PARIS", 1.0),
        ({"pattern": r"Answer: (\w+)", "case_fold": True}, "paris", "Answer: PARIS", 0.0),
        ({"pattern": r"(?i)answer: (\w+)"}, "Paris", "ANSWER: Paris", 0.0),
        ({"pattern": r"\d+"}, "12", "x 12 y", 0.0),
        ({"pattern": r"(a)(b)?c", "group": 2}, "b", "ac", 1.0),  # a group that took no part
        ({"pattern": r"(a)(b)?c", "group": 2}, "b", "abc", 0.0),
        ({"pattern": r"(?P<city>[A-Z]\w+)!", "group": "city"}, "Paris", "to Paris!", 0.0),
        ({"pattern": r"=(.*)$"}, "4", "2+2= 4 ", 0.0),
        ({"pattern": r"=(.*)$", "strip": False}, "4", "2+2= 4 ", 1.0),
        ({"pattern": r"is (.+)", "strip_punctuation": True}, "Paris", "is Paris.", 0.0),
        ({"pattern": r"(\w+)"}, ["x", "y"], "y", 0.0),
        ({"pattern": r"(.*)"}, "", "", 0.0),
    ],
)
def test_regex(settings_: dict[str, Any], answer: Any, response: str, expected: float) -> None:
    assert loss("regex", answer, response, **settings_) == expected


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"pattern": "(unclosed"}, r"pattern '\(unclosed' does not compile \(missing \), unterminated subpattern"),
        ({"pattern": "a(b)", "group": 2}, r"group 2 does not exist in pattern 'a\(b\)', which has 1 groups"),
        ({"pattern": "a", "group": 1}, "group 1 does not exist in pattern 'a', which has 0 groups"),
        ({"pattern": "a(?P<x>b)", "group": "y"}, r"group 'y' is not a named group of pattern .* named groups: x"),
    ],
)
def test_regex_bad_pattern_or_group(settings_: dict[str, Any], message: str) -> None:
    with pytest.raises(ContractError, match=f"scorer regex: {message}"):
        load_scorer("regex", settings_, HERE)


# -- choice ---------------------------------------------------------------------------------------------------------

ABCD = {"options": ["A", "B", "C", "D"]}


@pytest.mark.parametrize(
    ("response", "chosen"),
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B.", "B"),
        ("B)", "B"),
        ("  C\n", "C"),
        ("Answer: D", "D"),
        ("The answer is (C).", "C"),
        ("the ANSWER is: B", "B"),
        ("**Answer:** A", "A"),
        ("Answer - C", "C"),
        ("Between A and B, the answer is B", "B"),  # the marker wins over earlier options
        ("Between A and B", "A"),  # no marker: the first standalone option
        ("a cat sat. D", "D"),  # lowercase is not an option
        ("BAD CAB", None),  # letters inside words are not options
        ("A1 or B2", None),
        ("_B_", "B"),  # only letters and digits join an option to a word
        ("Bé or C", "C"),
        ("", None),
        ("none of them", None),
        ("Answer: E, so A", "A"),  # a marker not followed by an option is no marker
    ],
)
def test_choice_extraction(response: str, chosen: str | None) -> None:
    s = scorer("choice", **ABCD)
    assert isinstance(s, Choice)
    assert s.choose(response) == chosen
    for option in ABCD["options"]:
        assert s.loss(unit(option), response) == (0.0 if option == chosen else 1.0)


def test_choice_with_word_options_prefers_the_longest() -> None:
    s = scorer("choice", options=["yes", "no", "yes-ish"])
    assert isinstance(s, Choice)
    assert s.choose("I'd say yes-ish.") == "yes-ish"
    assert s.choose("Answer: no") == "no"
    assert s.choose("yesterday, no") == "no"


def test_choice_answer_not_an_option_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_text('{"id":"q1","prompt":"?","answer":"A"}\n{"id":"q2","prompt":"?","answer":"E"}\n')
    s = scorer("choice", **ABCD)
    with pytest.raises(ScorerError, match=r"scorer choice: unit 'q2' \(line 2\): answer 'E' is not one of the "
                                          "options A, B, C, D; give one of them"):
        check_units(s, load_units(path))


@pytest.mark.parametrize(
    ("options", "message"),
    [(["A", "A"], "repeat"), (["A", ""], "option '' is empty"), (["A", " B"], "option ' B' is empty or has")],
)
def test_choice_bad_options(options: list[str], message: str) -> None:
    with pytest.raises(ContractError, match=f"scorer choice: .*{message}"):
        scorer("choice", options=options)


@settings(max_examples=100, deadline=None)
@given(option=st.sampled_from("ABCDEFGH"),
       form=st.sampled_from(["{}", "({})", "{}.", "{})", "Answer: {}", "The answer is ({})", "answer is {}!"]),
       prose=st.text(alphabet="bcdefghjkmnopqrstuvwxyz ,.\n", max_size=20))
def test_choice_reads_the_option_in_any_documented_form(option: str, form: str, prose: str) -> None:
    s = scorer("choice", options=list("ABCDEFGH"))
    assert isinstance(s, Choice)
    assert s.choose(f"{prose} {form.format(option)} {prose}") == option


# -- arithmetic-exact -----------------------------------------------------------------------------------------------

def test_arithmetic_exact_gives_the_arithmetic_losses() -> None:
    path = ROOT / "data" / "arith-eval.jsonl"
    units = load_units(path)[:500]
    s = scorer("arithmetic-exact")
    check_units(s, units)
    for u in units:
        assert u.prompt is not None
        for response in (u.answer, f"{u.answer} ", f"0{u.answer}", str(int(u.answer) + 1), "", "-0", f"-{u.answer}"):
            assert s.loss(u, response) == arithmetic.score(u.prompt, response)
    problems = arithmetic.population("eval", 3, 50, "p")
    assert losses(s, problems, [p.answer for p in problems]) == [0.0] * 50  # Problems stand where Units stand


@settings(max_examples=100, deadline=None)
@given(response=st.text(alphabet="0123456789-+ \n", max_size=6), index=st.integers(0, 10**6))
def test_arithmetic_exact_agrees_on_any_response(response: str, index: int) -> None:
    p = arithmetic.draw(11, index)
    u = Unit(p.id, p.prompt, None, p.answer, kind=p.kind)
    assert scorer("arithmetic-exact").loss(u, response) == arithmetic.score(p.prompt, response)


def test_arithmetic_exact_refuses_wrong_answers_and_message_units() -> None:
    s = scorer("arithmetic-exact")
    with pytest.raises(ScorerError, match=r"scorer arithmetic-exact: unit 'u1': answer '5' is not the canonical "
                                          r"answer 4 to '2\+2='"):
        s.check(unit("5", prompt="2+2="))
    with pytest.raises(ScorerError, match="unit 'u1': prompt 'two plus two' is not an arithmetic problem"):
        s.loss(unit("4", prompt="two plus two"), "4")
    with pytest.raises(ScorerError, match="unit 'm': has messages, but arithmetic-exact scores prompt units"):
        s.check(Unit("m", None, (), "4"))


# -- user scorers ---------------------------------------------------------------------------------------------------

SCORER_PY = '''
import math

def score(unit, response, params):
    if response == "raise":
        raise ValueError("cannot score\\nthis")
    if response == "big":
        return 7
    if response == "nan":
        return math.nan
    if response == "bool":
        return True
    if response == "text":
        return "0.5"
    if response == "half":
        return 0.5
    return params.get("miss", 1) if response != unit.answer else 0

not_callable = 3
'''

USER = {"loss_range": [0, 1]}


def write_scorer(folder: Path, text: str = SCORER_PY, name: str = "my_scorer.py") -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_user_scorer_loads_pinned_and_scores(tmp_path: Path) -> None:
    sha = write_scorer(tmp_path / "scorers")
    s = load_scorer("scorers/my_scorer.py:score", {**USER, "params": {"miss": 0.25}}, tmp_path, sha)
    assert s.loss(unit("x"), "x") == 0.0
    assert s.loss(unit("x"), "y") == 0.25
    assert s.loss(unit("x"), "half") == 0.5
    assert isinstance(s.loss(unit("x"), "x"), float)
    assert not s.binary
    assert not is_binary(s)
    assert s.loss_range == (0.0, 1.0)
    assert scorer_identity(s) == {
        "name": "scorers/my_scorer.py:score", "version": sha, "path": "scorers/my_scorer.py", "sha256": sha,
        "settings": {"loss_range": [0.0, 1.0], "binary": False, "params": {"miss": 0.25}},
    }
    assert load_scorer("scorers/my_scorer.py:score", USER, tmp_path, None).version == sha  # unpinned: computed


def test_user_scorer_edited_after_pinning_is_refused(tmp_path: Path) -> None:
    sha = write_scorer(tmp_path)
    load_scorer("my_scorer.py:score", USER, tmp_path, sha)
    edited = write_scorer(tmp_path, SCORER_PY.replace("return 7", "return 0"))
    with pytest.raises(ContractError, match=f"scorer file {re.escape(str(tmp_path / 'my_scorer.py'))} has sha256 "
                                            f"{edited} but {sha} was declared"):
        load_scorer("my_scorer.py:score", USER, tmp_path, sha)


def test_two_files_never_share_a_module(tmp_path: Path) -> None:
    write_scorer(tmp_path, "def f(u, r, p):\n    return 0\n", "a/s.py")
    write_scorer(tmp_path, "def f(u, r, p):\n    return 1\n", "b/s.py")
    a = load_scorer("a/s.py:f", USER, tmp_path)
    b = load_scorer("b/s.py:f", USER, tmp_path)
    assert (a.loss(unit("x"), "x"), b.loss(unit("x"), "x")) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ("raise", "raised ValueError: cannot score this; fix the scorer"),
        ("big", r"returned 7, outside its declared loss_range \[0.0, 1.0\]"),
        ("nan", r"returned nan, outside its declared loss_range"),
        ("bool", r"returned True \(bool\), not an int or float loss"),
        ("text", r"returned '0.5' \(str\), not an int or float loss"),
    ],
)
def test_user_scorer_failures_name_scorer_and_unit(tmp_path: Path, response: str, message: str) -> None:
    write_scorer(tmp_path)
    s = load_scorer("my_scorer.py:score", USER, tmp_path)
    with pytest.raises(ScorerError, match=f"scorer my_scorer.py:score: unit 'u9' \\(line 3\\): {message}") as info:
        losses(s, [unit("x"), unit("x", uid="u9", line=3)], ["x", response])
    assert "\n" not in str(info.value)


def test_binary_user_scorer_must_return_0_or_1(tmp_path: Path) -> None:
    write_scorer(tmp_path)
    s = load_scorer("my_scorer.py:score", {**USER, "binary": True}, tmp_path)
    assert s.binary
    assert is_binary(s)
    assert s.loss(unit("x"), "x") == 0.0
    with pytest.raises(ScorerError, match=r"returned 0\.5, but it is declared binary"):
        s.loss(unit("x"), "half")


def test_user_scorer_wide_range(tmp_path: Path) -> None:
    write_scorer(tmp_path)
    s = load_scorer("my_scorer.py:score", {"loss_range": [-1, 10]}, tmp_path)
    assert s.loss(unit("x"), "big") == 7.0
    assert s.loss_range == (-1.0, 10.0)


@pytest.mark.parametrize(
    ("name", "settings_", "message"),
    [
        ("my_scorer.py:missing", USER, r"has no function 'missing': define missing\(unit, response, params\)"),
        ("my_scorer.py:not_callable", USER, "has no function 'not_callable'"),
        ("my_scorer.py:1x", USER, "'1x' is not a function name"),
        ("/abs/my_scorer.py:score", USER, "the path /abs/my_scorer.py is absolute"),
        ("nope.py:score", USER, "scorer file .*nope.py does not exist"),
        ("my_scorer.py:score", {}, "setting loss_range: Field required"),
        ("my_scorer.py:score", {"loss_range": [1, 0]}, "loss_range .* must be two finite numbers a < b"),
        ("my_scorer.py:score", {"loss_range": [0, 2], "binary": True}, r"binary = true needs loss_range \[0, 1\]"),
        ("my_scorer.py:score", {**USER, "range": [0, 1]}, "unknown setting 'range'; the settings of .* are "
                                                          "loss_range, binary, params"),
    ],
)
def test_user_scorer_declaration_errors(tmp_path: Path, name: str, settings_: dict[str, Any], message: str) -> None:
    write_scorer(tmp_path)
    with pytest.raises(ContractError, match=message) as info:
        load_scorer(name, settings_, tmp_path)
    assert "\n" not in str(info.value)


def test_user_scorer_that_fails_to_import(tmp_path: Path) -> None:
    write_scorer(tmp_path, "def f(:\n", "broken.py")
    with pytest.raises(ContractError, match=r"scorer broken.py:f: .*broken.py failed to load \(SyntaxError"):
        load_scorer("broken.py:f", USER, tmp_path)
    write_scorer(tmp_path, "raise RuntimeError('no')\n", "raises.py")
    with pytest.raises(ContractError, match=r"raises.py failed to load \(RuntimeError: no\)"):
        load_scorer("raises.py:f", USER, tmp_path)


def test_user_scorer_params_are_read_only(tmp_path: Path) -> None:
    write_scorer(tmp_path, "def f(u, r, p):\n    p['k'] = 1\n    return 0\n", "mut.py")
    s = load_scorer("mut.py:f", {**USER, "params": {"k": 0}}, tmp_path)
    with pytest.raises(ScorerError, match="raised TypeError"):
        s.loss(unit("x"), "x")


def test_losses_lengths_must_agree() -> None:
    with pytest.raises(ValueError, match="2 units but 1 responses"):
        losses(scorer("exact-match"), [unit("a"), unit("b")], ["a"])
