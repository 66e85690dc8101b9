"""Scorers: the declared rule that turns a unit and a response text into a task loss.

Decisions this module embodies:

- **A scorer is fully declared.** It is a name, a version and settings; `scorer_identity` is what a contract binds,
  so two contracts with equal identities score every response alike. Settings are validated when the scorer is
  loaded (strict types: `true`, not `"true"`; an unknown setting is refused with the list of valid ones), and
  the identity holds every setting, defaults included, so a later change of a default cannot move a bound
  contract silently.
- **Losses are bounded, and binary losses are marked.** Each scorer declares its loss range `[a, b]` and whether
  it is binary (every loss exactly `a` or `b`, with `[a, b] = [0, 1]`). Built-in scorers are all binary: loss 0
  for a right response, 1 otherwise; the contract layer sends binary losses to the exact binomial methods and any
  other bounded loss to the bounded-mean methods.
- **A unit's answer is checked at load.** `check_units` runs each scorer's answer check over the population
  before anything is generated (a `choice` answer outside the options, a `numeric` answer that is not a number),
  naming the unit; `loss` repeats the check, so it never scores against an answer it cannot read.
- **Normalisation is declared, never implied.** `exact-match`, `regex` and `contains` apply the same four flags,
  to the answer and to the response alike, in this order: `strip_punctuation` (drop every character of Unicode
  category P*, so `$` and `+` stay), `collapse_whitespace` (each run of whitespace becomes one space), `strip`
  (leading and trailing whitespace), `case_fold` (`str.casefold`). Only `strip` is on by default. No Unicode
  normalisation is applied: a composed and a decomposed `é` differ.
- **Numbers are ASCII decimals.** `numeric` reads `[+-]?digits(.digits)?`: no exponent, no leading-dot `.5`, no
  Unicode minus; a sign belongs to the number unless a digit comes right before it (`10-3` reads 10 and 3). With
  `thousands = true` an integer part may group digits by commas (`1,000`, `12,345,678`; `1,0000` reads 1 and
  0000); without it, the default, `1,000` reads 1 and 000. Values are compared exactly as fractions with
  `math.isclose` semantics (`|x - y| <= max(rel_tol * max(|x|, |y|), abs_tol)`; both tolerances default to 0,
  i.e. exact), so `0.1` equals `0.10` and long integers do not round. No number, or one past Python's 4300-digit
  conversion limit, is loss 1.
- **Choice extraction.** `choice` reads the option that follows the first answer marker (`answer`, any case,
  then optional `is`, colons, dashes, asterisks and an opening `(`, `[` or `*`: "Answer: B", "the answer is (C)",
  "**Answer:** D"); with no marker, the first standalone option anywhere (one with no letter or digit right
  before or after it: "B", "(B)", "B.", "B)"). Options match case-sensitively, so the article "a" is not option
  "A". An option letter used as a word before the answer ("I think C" with option "I") is read as that option.
- **User scorers are files pinned by digest.** `path.py:function`, the path relative to the declaration's folder.
  The file's bytes are read once; the sha256 is of those bytes and those bytes are what is compiled and run, so
  the digest always names the code that scored. The module is named by the digest (two files never collide).
  The function is called as `function(unit, response_text, params)` with the declared `params` (read-only) and
  must return an `int` or `float` (a `bool` is refused: `True` reads as a loss of 1, the opposite of what a
  function answering "correct?" means) that is finite and within the declared `loss_range`; with `binary = true`
  it must be exactly 0 or 1. Anything else, or an exception, is a one-line `ScorerError` naming the scorer and
  the unit. The core cannot check that the function is deterministic; the contract assumes it is.
- **`arithmetic-exact` is the arithmetic task's own scorer**, `arithmetic.score` taken from (prompt, response) to
  (unit, response), with the same losses.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import sys
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from invar.canonical import show
from invar.errors import ContractError
from invar.owner_files import TYPE_ERRORS, write_instead
from invar.tasks import arithmetic
from invar.tasks.population import check_sha256, freeze, read_regular_file, thaw


class ScorerError(ContractError):
    """A scorer could not score a unit: its answer is unusable, or a user scorer raised or returned a bad value."""


class ScoredUnit(Protocol):
    """What a scorer reads of a unit: `population.Unit` and `arithmetic.Problem` both qualify."""

    @property
    def id(self) -> str: ...

    @property
    def prompt(self) -> str | None: ...

    @property
    def answer(self) -> Any: ...


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _where(unit: ScoredUnit) -> str:
    line = getattr(unit, "line", 0)
    return f"unit {unit.id!r}" + (f" (line {line})" if isinstance(line, int) and line > 0 else "")


class Scorer(ABC):
    """A declared scorer: `loss(unit, response)` is the task loss of one response, within `loss_range`."""

    name: str
    version: str
    settings: Mapping[str, Any]
    """The full settings, defaults included, as plain JSON values."""
    loss_range: tuple[float, float]
    binary: bool
    """Every loss is exactly `loss_range[0]` or `loss_range[1]`, and the range is [0, 1]."""

    @property
    def is_binary(self) -> bool:
        return self.binary

    @abstractmethod
    def check(self, unit: ScoredUnit) -> None:
        """Raise `ScorerError` naming the unit unless this scorer can read its answer (and prompt)."""

    @abstractmethod
    def loss(self, unit: ScoredUnit, response: str) -> float:
        """The loss of `response` (the generated text) for `unit`; raises `ScorerError` naming the unit."""

    def _refuse(self, unit: ScoredUnit, what: str) -> ScorerError:
        return ScorerError(f"scorer {self.name}: {_where(unit)}: {what}")


# -- settings -------------------------------------------------------------------------------------------------------

class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Normalisation(_Settings):
    """The normalisation flags shared by exact-match, regex and contains (see the module docstring for the order)."""

    strip: bool = True
    case_fold: bool = False
    collapse_whitespace: bool = False
    strip_punctuation: bool = False

    def apply(self, text: str) -> str:
        if self.strip_punctuation:
            text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
        if self.collapse_whitespace:
            text = re.sub(r"\s+", " ", text)
        if self.strip:
            text = text.strip()
        if self.case_fold:
            text = text.casefold()
        return text


class ExactMatchSettings(Normalisation):
    pass


class ContainsSettings(Normalisation):
    pass


class RegexSettings(Normalisation):
    pattern: str
    group: int | str | None = None
    """The group whose text is compared: default 1, or 0 (the whole match) when the pattern has no groups."""


class NumericSettings(_Settings):
    which: Literal["first", "last"] = "last"
    abs_tol: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    rel_tol: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    thousands: bool = False


class ChoiceSettings(_Settings):
    options: list[str] = Field(min_length=2)


class UserSettings(_Settings):
    loss_range: list[float] = Field(min_length=2, max_length=2)
    binary: bool = False
    params: dict[str, Any] = Field(default_factory=dict)


class _NoSettings(_Settings):
    pass


_S = TypeVar("_S", bound=_Settings)


def _settings(name: str, model: type[_S], settings: Mapping[str, Any]) -> _S:
    """`settings` validated as `model`, or one-line `ContractError`s naming the setting and the valid ones."""
    valid = list(model.model_fields)
    for key in settings:
        if key not in valid:
            listing = f"the settings of {name} are {', '.join(valid)}" if valid else f"{name} takes no settings"
            raise ContractError(f"scorer {name}: unknown setting {show(key)}; {listing}")
    try:
        return model.model_validate(dict(settings))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        kind = TYPE_ERRORS.get(err["type"])  # nothing is coerced: say what to write instead
        advice = "" if kind is None else f"; {write_instead(kind, err.get('input'))}"
        raise ContractError(f"scorer {name}: setting {loc}: {_one_line(err['msg'])}"
                            f" (got {show(err.get('input'))}){advice}") from None


def _answers(scorer: Scorer, unit: ScoredUnit) -> tuple[str, ...]:
    """The acceptable answers of a unit whose answer is a string or a non-empty list of strings."""
    answer = unit.answer
    if isinstance(answer, str):
        return (answer,)
    if isinstance(answer, list | tuple) and answer and all(isinstance(a, str) for a in answer):
        return tuple(answer)
    raise scorer._refuse(unit, f"answer {show(answer)} is not a string or a non-empty list of strings; give the "
                                "acceptable answer text")


def _text(response: Any) -> str:
    if not isinstance(response, str):
        raise TypeError(f"a response is text, not {type(response).__name__}")
    return response


# -- built-in scorers -----------------------------------------------------------------------------------------------

class _Builtin(Scorer):
    version = "1"
    loss_range = (0.0, 1.0)
    binary = True
    SETTINGS: ClassVar[type[_Settings]]

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.config = _settings(self.name, self.SETTINGS, settings)
        self.settings = self.config.model_dump()

    def check(self, unit: ScoredUnit) -> None:
        self._expected(unit)

    def loss(self, unit: ScoredUnit, response: str) -> float:
        return 0.0 if self._right(self._expected(unit), _text(response)) else 1.0

    @abstractmethod
    def _expected(self, unit: ScoredUnit) -> Any:
        """The answer in the form `_right` compares; raises `ScorerError` when it is unusable."""

    @abstractmethod
    def _right(self, expected: Any, response: str) -> bool: ...


class ExactMatch(_Builtin):
    """Loss 0 when the normalised response equals one normalised acceptable answer."""

    name = "exact-match"
    SETTINGS = ExactMatchSettings
    config: ExactMatchSettings

    def _expected(self, unit: ScoredUnit) -> frozenset[str]:
        return frozenset(self.config.apply(a) for a in _answers(self, unit))

    def _right(self, expected: frozenset[str], response: str) -> bool:
        return self.config.apply(response) in expected


class Contains(_Builtin):
    """Loss 0 when one normalised acceptable answer occurs in the normalised response."""

    name = "contains"
    SETTINGS = ContainsSettings
    config: ContainsSettings

    def _expected(self, unit: ScoredUnit) -> tuple[str, ...]:
        answers = tuple(self.config.apply(a) for a in _answers(self, unit))
        if "" in answers:
            raise self._refuse(unit, "an answer is empty after normalisation, so every response would contain it; "
                                     "give non-empty answer text")
        return answers

    def _right(self, expected: tuple[str, ...], response: str) -> bool:
        text = self.config.apply(response)
        return any(a in text for a in expected)


class RegexMatch(_Builtin):
    """Loss 0 when the chosen group of the first match (`re.search`), normalised, equals an acceptable answer."""

    name = "regex"
    SETTINGS = RegexSettings
    config: RegexSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        pattern = self.config.pattern
        try:
            self.compiled = re.compile(pattern)
        except re.error as exc:
            raise ContractError(f"scorer regex: pattern {pattern!r} does not compile ({exc}): fix the pattern"
                                ) from None
        group = self.config.group
        if group is None:
            group = 1 if self.compiled.groups else 0
        elif isinstance(group, int) and not 0 <= group <= self.compiled.groups:
            raise ContractError(f"scorer regex: group {group} does not exist in pattern {pattern!r}, which has "
                                f"{self.compiled.groups} groups: choose 0 to {self.compiled.groups}")
        elif isinstance(group, str) and group not in self.compiled.groupindex:
            names = ", ".join(self.compiled.groupindex) or "none"
            raise ContractError(f"scorer regex: group {group!r} is not a named group of pattern {pattern!r} "
                                f"(its named groups: {names})")
        self.group: int | str = group
        self.settings = {**self.settings, "group": group}

    def _expected(self, unit: ScoredUnit) -> frozenset[str]:
        return frozenset(self.config.apply(a) for a in _answers(self, unit))

    def _right(self, expected: frozenset[str], response: str) -> bool:
        match = self.compiled.search(response)
        if match is None:
            return False
        captured = match.group(self.group)
        return captured is not None and self.config.apply(captured) in expected


_DECIMAL = r"(?:\.[0-9]+)?"
_PLAIN_INT = r"[0-9]+"
_GROUPED_INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)"


def number_pattern(thousands: bool) -> re.Pattern[str]:
    """The numbers `numeric` reads (see the module docstring): a sign only when no digit precedes it."""
    integer = _GROUPED_INT if thousands else _PLAIN_INT
    return re.compile(rf"(?<![0-9])[-+]?{integer}{_DECIMAL}")


def _fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except ValueError:  # past Python's digit limit for int conversion
        return None


class Numeric(_Builtin):
    """Loss 0 when the first or last number of the response is within the tolerances of the numeric answer."""

    name = "numeric"
    SETTINGS = NumericSettings
    config: NumericSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.number = number_pattern(self.config.thousands)
        self.abs_tol = Fraction(repr(self.config.abs_tol))
        self.rel_tol = Fraction(repr(self.config.rel_tol))

    def _expected(self, unit: ScoredUnit) -> Fraction:
        answer = unit.answer
        value: Fraction | None = None
        if isinstance(answer, int) and not isinstance(answer, bool):
            value = Fraction(answer)
        elif isinstance(answer, float) and math.isfinite(answer):
            value = Fraction(repr(answer))  # the decimal the file wrote, not the binary float nearest to it
        elif isinstance(answer, str) and self.number.fullmatch(answer):
            value = _fraction(answer)
        if value is None:
            grouping = " (digits grouped by commas allowed)" if self.config.thousands else ""
            raise self._refuse(unit, f"answer {show(answer)} is not a finite number or a decimal string{grouping}; "
                                     "give the numeric answer")
        return value

    def _right(self, expected: Fraction, response: str) -> bool:
        found = self.number.findall(response)
        if not found:
            return False
        value = _fraction(found[0] if self.config.which == "first" else found[-1])
        if value is None:
            return False
        return abs(value - expected) <= max(self.rel_tol * max(abs(value), abs(expected)), self.abs_tol)


class Choice(_Builtin):
    """Loss 0 when the option read from the response (see the module docstring) is the unit's answer."""

    name = "choice"
    SETTINGS = ChoiceSettings
    config: ChoiceSettings

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        options = self.config.options
        for option in options:
            if not option or option != option.strip():
                raise ContractError(f"scorer choice: option {option!r} is empty or has surrounding spaces; "
                                    "give options such as [\"A\", \"B\", \"C\", \"D\"]")
        if len(set(options)) != len(options):
            raise ContractError(f"scorer choice: options {options} repeat; give each option once")
        self.options = frozenset(options)
        alternatives = "|".join(re.escape(o) for o in sorted(options, key=len, reverse=True))
        option = rf"(?P<option>{alternatives})(?![^\W_])"
        sep = r"[\s:：*\-]*"
        self.marked = re.compile(rf"(?i:\banswer\b){sep}(?:(?i:is\b){sep})?[(\[*]*\s*{option}")
        self.standalone = re.compile(rf"(?<![^\W_]){option}")

    def choose(self, response: str) -> str | None:
        """The option a response chooses, or None."""
        match = self.marked.search(response) or self.standalone.search(response)
        return None if match is None else match.group("option")

    def _expected(self, unit: ScoredUnit) -> str:
        if not isinstance(unit.answer, str) or unit.answer not in self.options:
            raise self._refuse(unit, f"answer {show(unit.answer)} is not one of the options "
                                     f"{', '.join(self.config.options)}; give one of them")
        return unit.answer

    def _right(self, expected: str, response: str) -> bool:
        return self.choose(response) == expected


class ArithmeticExact(_Builtin):
    """`arithmetic.score` on the unit's prompt: loss 0 exactly for the canonical decimal answer."""

    name = arithmetic.SCORER_NAME
    SETTINGS = _NoSettings

    def _expected(self, unit: ScoredUnit) -> int:
        prompt = unit.prompt
        if prompt is None:
            raise self._refuse(unit, "has messages, but arithmetic-exact scores prompt units; give a prompt")
        try:
            value = arithmetic.answer_of(prompt)
        except ContractError as exc:
            raise self._refuse(unit, str(exc)) from None
        expected = str(value)
        if unit.answer != expected:
            raise self._refuse(unit, f"answer {show(unit.answer)} is not the canonical answer {expected} to "
                                     f"{prompt!r}")
        return value

    def _right(self, expected: int, response: str) -> bool:
        # `arithmetic.score(prompt, response) == 0`, the prompt's value computed once, above
        return arithmetic.answer_loss(expected, response) == 0


BUILTIN_SCORERS: Mapping[str, Callable[[Mapping[str, Any]], Scorer]] = {
    s.name: s for s in (ExactMatch, Numeric, RegexMatch, Choice, Contains, ArithmeticExact)
}
"""The built-in scorers by name."""


# -- user scorers ---------------------------------------------------------------------------------------------------

class UserScorer(Scorer):
    """A function in a file, pinned by the sha256 of the bytes that were compiled."""

    def __init__(self, name: str, rel_path: str, function: str, base_dir: Path, settings: Mapping[str, Any],
                 pinned_sha256: str | None, kept: bytes | None = None) -> None:
        self.name = name
        config = _settings(name, UserSettings, settings)
        low, high = config.loss_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ContractError(f"scorer {name}: loss_range {config.loss_range} must be two finite numbers a < b")
        if config.binary and (low, high) != (0.0, 1.0):
            raise ContractError(f"scorer {name}: binary = true needs loss_range [0, 1], not {config.loss_range}")
        self.loss_range = (float(low), float(high))
        self.binary = config.binary
        self.params = freeze(config.params)
        self.path = rel_path
        path = base_dir / rel_path
        data = read_regular_file(path, "scorer file") if kept is None else kept
        self.sha256 = (hashlib.sha256(data).hexdigest() if pinned_sha256 is None
                       else check_sha256("scorer file", path, data, pinned_sha256))
        self.version = self.sha256
        self.data = data
        """The bytes compiled and run (a run keeps them, so its rewards can be recomputed from its records)."""
        self.settings = {"loss_range": [low, high], "binary": self.binary, "params": thaw(self.params)}
        self.function = _load_function(name, path, data, self.sha256, function)

    def check(self, unit: ScoredUnit) -> None:
        """A user scorer reads answers its own way; its errors surface when it scores."""

    def loss(self, unit: ScoredUnit, response: str) -> float:
        text = _text(response)
        try:
            value = self.function(unit, text, self.params)
        except Exception as exc:  # the owner's code: any failure is reported against the unit it failed on
            raise self._refuse(unit, f"raised {type(exc).__name__}: {_one_line(str(exc))}; fix the scorer") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._refuse(unit, f"returned {show(value)} ({type(value).__name__}), not an int or float loss")
        loss = float(value)
        low, high = self.loss_range
        if not math.isfinite(loss) or not low <= loss <= high:
            raise self._refuse(unit, f"returned {show(value)}, outside its declared loss_range [{low}, {high}]")
        if self.binary and loss not in (0.0, 1.0):
            raise self._refuse(unit, f"returned {show(value)}, but it is declared binary (0 or 1 only)")
        return loss


def _load_function(name: str, path: Path, data: bytes, sha256: str, function: str) -> Callable[..., Any]:
    """`function` of the module compiled from exactly `data`, named by its digest so no two files share a module."""
    module_name = f"invar_user_scorer_{sha256}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_loader(module_name, loader=None, origin=str(path))
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__file__ = str(path)
        sys.modules[module_name] = module  # before running, as importlib does, so dataclasses and pickling find it
        try:
            exec(compile(data, str(path), "exec", dont_inherit=True), module.__dict__)
        except Exception as exc:  # the owner's code failed to import
            del sys.modules[module_name]
            raise ContractError(f"scorer {name}: {path} failed to load ({type(exc).__name__}: "
                                f"{_one_line(str(exc))}): fix the file") from None
    fn = getattr(module, function, None)
    if fn is None or not callable(fn):
        raise ContractError(f"scorer {name}: {path} has no function {function!r}: define "
                            f"{function}(unit, response, params)")
    return fn  # type: ignore[no-any-return]


def _split_user_name(name: str) -> tuple[str, str] | None:
    path, sep, function = name.rpartition(":")
    if not sep or not path.endswith(".py"):
        return None
    return path, function


def load_scorer(name: str, settings: Mapping[str, Any], base_dir: Path, pinned_sha256: str | None = None, *,
                kept: bytes | None = None) -> Scorer:
    """The scorer a declaration names: a built-in (`BUILTIN_SCORERS`) or `path.py:function` under `base_dir`.

    `pinned_sha256` is the digest a contract pinned for a user scorer's file (None when preparing one); a built-in
    takes none. `kept`: a user scorer's file as a run keeps it, used instead of reading the file (and checked
    against `pinned_sha256` all the same). Raises `ContractError` (one line) for an unknown name, bad settings, or
    a file that is missing, changed or fails to load.
    """
    builtin = BUILTIN_SCORERS.get(name)
    if builtin is not None:
        if pinned_sha256 is not None:
            raise ContractError(f"scorer {name} is built in and has no file to pin: remove its sha256")
        return builtin(settings)
    user = _split_user_name(name)
    if user is None:
        raise ContractError(f"scorer {show(name, 80)} is unknown: use one of {', '.join(BUILTIN_SCORERS)}, or "
                            "'path.py:function' for a function in a file next to the declaration")
    rel, function = user
    if not function.isidentifier():
        raise ContractError(f"scorer {name}: {function!r} is not a function name: write 'path.py:function'")
    if PurePosixPath(rel).is_absolute() or Path(rel).is_absolute():
        raise ContractError(f"scorer {name}: the path {rel} is absolute: give it relative to the declaration's "
                            "folder, so the declaration moves with its files")
    return UserScorer(name, rel, function, Path(base_dir), settings, pinned_sha256, kept)


def scorer_identity(scorer: Scorer) -> dict[str, Any]:
    """What a contract binds of a scorer: name, version and settings, and for a user scorer its path and sha256."""
    identity: dict[str, Any] = {"name": scorer.name, "version": scorer.version, "settings": dict(scorer.settings)}
    if isinstance(scorer, UserScorer):
        identity["path"] = scorer.path
        identity["sha256"] = scorer.sha256
    return identity


def is_binary(scorer: Scorer) -> bool:
    """Whether every loss of `scorer` is exactly 0 or 1 (the exact binomial methods apply)."""
    return scorer.binary


def loss_range(scorer: Scorer) -> tuple[float, float]:
    """The declared bounds [a, b] of every loss of `scorer` (the bounded-mean methods use them)."""
    return scorer.loss_range


def check_units(scorer: Scorer, units: Sequence[ScoredUnit]) -> None:
    """Raise `ScorerError` naming the first unit whose answer `scorer` cannot read."""
    for unit in units:
        scorer.check(unit)


def losses(scorer: Scorer, units: Sequence[ScoredUnit], responses: Sequence[str]) -> list[float]:
    """The loss of each response for its unit; raises `ScorerError` naming the first unit that fails."""
    if len(units) != len(responses):
        raise ValueError(f"{len(units)} units but {len(responses)} responses")
    return [scorer.loss(u, r) for u, r in zip(units, responses, strict=True)]
