"""Typed evidence: the numbers a decision may rest on, bound to the records that hold them and tagged with the
package (reference or candidate) that produced them.

At run time a loss is an integer and a role is a string, so nothing stops a reference's losses standing in for the
candidate's, a bare array standing in for recorded evidence, or a float ε standing in for the contract's exact one.
These types make each of those a type error where it is written (`mypy --strict`; tests/typing holds the cases):
`Losses` is built only from recorded, answered calls (`recorded_losses` from store records, `bound_losses` from the
planned-call evidence admission binds), carries its package in its type, and the comparisons take the contract's
`Decimal` ε and exact fractions only; `task_bound` accepts, per method, only the range that method supports.
`use admit` decides through these types: its paired losses are `paired_loss(Losses[Reference], Losses[Candidate])`
and its ε comparisons `within_epsilon`.

Losses of a bounded, non-binary scorer (a user scorer declared with `binary = false` and `loss_range = [a, b]`) are
floats, so they have their own sealed type, `RangeLosses`, built by `recorded_range_losses` and
`bound_range_losses`, tagged by package in the same way and carrying the declared range; `paired_range_loss`
pairs them. 0/1 losses and range losses never stand in for each other: neither type is the other's, and each
pairing function takes one kind only. Their sums are kept exactly (a float is an exact fraction), so the mean
increase compared with ε is still exact.

What a call's report says about the package that made it is evidence too: `check_patches_active` refuses a call in
which a declared patch did not run. It lives here, below both the runner (which checks each call as it is answered)
and admission (which checks each recorded one again), so that neither has to import the other to apply one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Generic, Literal, Protocol, TypeVar, final, get_args, overload

import numpy as np
import numpy.typing as npt

from invar.errors import EvidenceError
from invar.printed import Closed
from invar.records.store import CallRecord
from invar.stats.bounds import Bound, bound


class TaskLossOutput(Closed):
    n: int
    reference_loss: int
    candidate_loss: int
    worse: int
    better: int
    mean_difference: str
    """Exact, as a fraction (e.g. "3/200"): the number the decision compares with ε."""
    mean_difference_float: float


class RangeTaskLossOutput(Closed):
    """The task loss of a scorer whose losses lie in a declared range (`binary = false`), not 0/1."""

    n: int
    loss_range: tuple[float, float]
    """The scorer's declared [a, b]; each paired difference lies in [a − b, b − a]."""
    reference_loss: str
    """The reference's losses summed exactly, as a fraction (each float loss is one)."""
    reference_loss_float: float
    candidate_loss: str
    candidate_loss_float: float
    worse: int
    better: int
    mean_difference: str
    """Exact, as a fraction: the number the decision compares with ε."""
    mean_difference_float: float


class EvidenceOutput(Closed):
    """One planned call (generate or score) and the record that answered it."""

    call: str
    record: int
    call_id: int
    call_digest: str
    report_digest: str


@dataclass(frozen=True)
class TaskLoss:
    """The paired task-loss comparison over the planned units."""

    n: int
    reference_loss: int
    candidate_loss: int
    worse: int
    """Units where the candidate's loss exceeds the reference's."""
    better: int
    """Units where it is lower."""

    @property
    def mean_difference(self) -> Fraction:
        """Mean of candidate loss minus reference loss, exactly (0 over no units: a run that stopped at a non-finite
        candidate call before any unit was paired, decided by that call, not by the losses)."""
        return Fraction(self.candidate_loss - self.reference_loss, self.n) if self.n else Fraction(0)

    def output(self) -> TaskLossOutput:
        """What a decision prints of it."""
        return TaskLossOutput(
            n=self.n, reference_loss=self.reference_loss, candidate_loss=self.candidate_loss, worse=self.worse,
            better=self.better, mean_difference=str(self.mean_difference),
            mean_difference_float=float(self.mean_difference))


def paired_task_loss(reference: np.ndarray, candidate: np.ndarray) -> TaskLoss:
    """Summaries of per-unit losses `reference`, `candidate` (int64[n] each, aligned by unit)."""
    d = candidate - reference
    return TaskLoss(
        n=len(d), reference_loss=int(reference.sum()), candidate_loss=int(candidate.sum()),
        worse=int((d > 0).sum()), better=int((d < 0).sum()),
    )


@dataclass(frozen=True)
class RangeTaskLoss:
    """The paired task-loss comparison over the planned units, for losses in a declared range [a, b] (not 0/1)."""

    n: int
    loss_range: tuple[float, float]
    """The scorer's declared [a, b]; each paired difference lies in [a − b, b − a]."""
    reference_loss: Fraction
    """The reference's losses summed exactly (each float loss is an exact fraction)."""
    candidate_loss: Fraction
    worse: int
    """Units where the candidate's loss exceeds the reference's."""
    better: int
    """Units where it is lower."""

    @property
    def mean_difference(self) -> Fraction:
        """Mean of candidate loss minus reference loss, exactly (0 over no units, as `TaskLoss`'s)."""
        return (self.candidate_loss - self.reference_loss) / self.n if self.n else Fraction(0)

    def output(self) -> RangeTaskLossOutput:
        """What a decision prints of it."""
        return RangeTaskLossOutput(
            n=self.n, loss_range=self.loss_range, reference_loss=str(self.reference_loss),
            reference_loss_float=float(self.reference_loss), candidate_loss=str(self.candidate_loss),
            candidate_loss_float=float(self.candidate_loss), worse=self.worse, better=self.better,
            mean_difference=str(self.mean_difference), mean_difference_float=float(self.mean_difference))


def paired_range_task_loss(reference: npt.NDArray[np.float64], candidate: npt.NDArray[np.float64],
                           loss_range: tuple[float, float]) -> RangeTaskLoss:
    """Summaries of per-unit losses in [a, b] (float64[n] each, aligned by unit), summed exactly: a float sum
    could round the mean increase across ε."""
    return RangeTaskLoss(
        n=len(reference), loss_range=loss_range,
        reference_loss=sum((Fraction(x) for x in reference.tolist()), Fraction(0)),
        candidate_loss=sum((Fraction(x) for x in candidate.tolist()), Fraction(0)),
        worse=int((candidate > reference).sum()), better=int((candidate < reference).sum()),
    )


class Answered(Protocol):
    """A planned call's evidence as admission binds it (`invar.contract.bind.CallEvidence`): only made from a
    recorded call whose report answered it."""

    @property
    def name(self) -> str: ...

    @property
    def report_digest(self) -> str: ...


@final
class Reference:
    """Type tag: evidence from the contract's reference package."""


@final
class Candidate:
    """Type tag: evidence from the contract's candidate package."""


RoleT = TypeVar("RoleT", Reference, Candidate)


@final
class _Seal:
    """Only this module holds one: `Losses` is built by `recorded_losses`, never from bare numbers."""


_SEAL = _Seal()


@final
class Losses(Generic[RoleT]):
    """One package's per-unit task losses, each bound to the answered call record it was scored from."""

    __slots__ = ("records", "role", "values")

    def __init__(self, seal: _Seal, role: type[RoleT], values: npt.NDArray[np.int64],
                 records: tuple[CallRecord | Answered, ...]) -> None:
        if seal is not _SEAL:
            raise EvidenceError("losses are evidence only when bound to records: build them with recorded_losses")
        self.role: type[RoleT] = role
        self.values: npt.NDArray[np.int64] = values
        self.records: tuple[CallRecord | Answered, ...] = records


def recorded_losses(role: type[RoleT], records: Sequence[CallRecord], values: Sequence[int]) -> Losses[RoleT]:
    """Losses of `role`'s package, unit i scored from the output `records[i]` holds (one record may hold several
    units); refuses a record with no successful report."""
    if len(records) != len(values):
        raise EvidenceError(f"{len(values)} losses for {len(records)} records: each loss names the record it came from")
    for rec in records:
        if rec.report is None or not rec.report.report.ok:
            raise EvidenceError(f"{rec.name} has no successful report: no loss can be read from it")
    return Losses(_SEAL, role, np.asarray(values, dtype=np.int64), tuple(records))


def bound_losses(role: type[RoleT], records: Sequence[Answered | None], values: Any) -> Losses[RoleT]:
    """Losses of `role`'s package as admission reads them: unit i scored from the planned call `records[i]` that
    answered it; refuses a unit no recorded call answered."""
    if len(records) != len(values):
        raise EvidenceError(f"{len(values)} losses for {len(records)} records: each loss names the record it came from")
    missing = [i for i, rec in enumerate(records) if rec is None]
    if missing:
        raise EvidenceError(f"unit {missing[0]} has no recorded call that answered it: no loss can be read for it")
    return Losses(_SEAL, role, np.asarray(values, dtype=np.int64), tuple(r for r in records if r is not None))


def paired_loss(reference: Losses[Reference], candidate: Losses[Candidate]) -> TaskLoss:
    """The paired task-loss comparison: the reference's losses first, the candidate's second, by type."""
    if reference.values.shape != candidate.values.shape:
        raise EvidenceError(f"{reference.values.size} reference losses against {candidate.values.size} candidate "
                            "losses: pair the same units")
    return paired_task_loss(reference.values, candidate.values)


@final
class RangeLosses(Generic[RoleT]):
    """One package's per-unit task losses in the scorer's declared range [a, b] (floats, not 0/1), each bound to
    the answered call record it was scored from."""

    __slots__ = ("loss_range", "records", "role", "values")

    def __init__(self, seal: _Seal, role: type[RoleT], values: npt.NDArray[np.float64],
                 loss_range: tuple[float, float], records: tuple[CallRecord | Answered, ...]) -> None:
        if seal is not _SEAL:
            raise EvidenceError("losses are evidence only when bound to records: build them with "
                                "recorded_range_losses")
        self.role: type[RoleT] = role
        self.values: npt.NDArray[np.float64] = values
        self.loss_range: tuple[float, float] = loss_range
        self.records: tuple[CallRecord | Answered, ...] = records


def _range_values(values: Any, loss_range: tuple[float, float]) -> npt.NDArray[np.float64]:
    """`values` as float64, each finite and within `loss_range`; `EvidenceError` naming the first unit that is not."""
    low, high = loss_range
    array = np.asarray(values, dtype=np.float64)
    bad = ~(np.isfinite(array) & (array >= low) & (array <= high))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise EvidenceError(f"unit {first}: loss {float(array[first])!r} is outside the scorer's declared "
                            f"loss_range [{low:g}, {high:g}]")
    return array


def recorded_range_losses(role: type[RoleT], records: Sequence[CallRecord], values: Sequence[float],
                          loss_range: tuple[float, float]) -> RangeLosses[RoleT]:
    """Range losses of `role`'s package, unit i scored from the output `records[i]` holds; refuses a record with
    no successful report and a loss outside `loss_range`."""
    if len(records) != len(values):
        raise EvidenceError(f"{len(values)} losses for {len(records)} records: each loss names the record it came from")
    for rec in records:
        if rec.report is None or not rec.report.report.ok:
            raise EvidenceError(f"{rec.name} has no successful report: no loss can be read from it")
    return RangeLosses(_SEAL, role, _range_values(values, loss_range), loss_range, tuple(records))


def bound_range_losses(role: type[RoleT], records: Sequence[Answered | None], values: Any,
                       loss_range: tuple[float, float]) -> RangeLosses[RoleT]:
    """Range losses of `role`'s package as admission reads them: unit i scored from the planned call `records[i]`
    that answered it; refuses a unit no recorded call answered and a loss outside `loss_range`."""
    if len(records) != len(values):
        raise EvidenceError(f"{len(values)} losses for {len(records)} records: each loss names the record it came from")
    missing = [i for i, rec in enumerate(records) if rec is None]
    if missing:
        raise EvidenceError(f"unit {missing[0]} has no recorded call that answered it: no loss can be read for it")
    return RangeLosses(_SEAL, role, _range_values(values, loss_range), loss_range,
                       tuple(r for r in records if r is not None))


def paired_range_loss(reference: RangeLosses[Reference], candidate: RangeLosses[Candidate]) -> RangeTaskLoss:
    """The paired comparison of range losses: the reference's first, the candidate's second, by type, over one
    declared range."""
    if reference.values.shape != candidate.values.shape:
        raise EvidenceError(f"{reference.values.size} reference losses against {candidate.values.size} candidate "
                            "losses: pair the same units")
    if reference.loss_range != candidate.loss_range:
        raise EvidenceError(f"reference losses in {list(reference.loss_range)} against candidate losses in "
                            f"{list(candidate.loss_range)}: pair losses of one scorer")
    return paired_range_task_loss(reference.values, candidate.values, reference.loss_range)


def within_epsilon(increase: Fraction, epsilon: Decimal) -> bool:
    """Whether an exact mean loss increase is at most the contract's ε, compared exactly (no float rounding)."""
    return increase <= Fraction(epsilon)


BinaryMethod = Literal["paired-binary-exact", "paired-binary-score"]
"""Methods for 0/1 losses: d in [-1, 1] only."""
RangeMethod = Literal["hoeffding", "maurer-pontil", "betting"]
"""Methods for any bounded d in a declared [a, b]."""
RANGE_METHODS: tuple[RangeMethod, ...] = get_args(RangeMethod)


def range_method(method: str) -> RangeMethod:
    """`method` as a bounded-range method, or `EvidenceError` naming the ones there are."""
    for known in RANGE_METHODS:
        if method == known:
            return known
    raise EvidenceError(f"{method} is not a method for losses in a declared range; use one of "
                        f"{', '.join(RANGE_METHODS)}")


@overload
def task_bound(method: BinaryMethod, d: npt.ArrayLike, a: Literal[-1], b: Literal[1], delta: float, *,
               order: Literal["plan", "unverified"] = "unverified") -> Bound: ...


@overload
def task_bound(method: RangeMethod, d: npt.ArrayLike, a: float, b: float, delta: float, *,
               order: Literal["plan", "unverified"] = "unverified") -> Bound: ...


def task_bound(method: BinaryMethod | RangeMethod, d: npt.ArrayLike, a: float, b: float, delta: float, *,
               order: Literal["plan", "unverified"] = "unverified") -> Bound:
    """`invar.stats.bounds.bound`, typed: a binary method is called with [-1, 1] only, a method name is one the
    core knows."""
    return bound(method, d, a, b, delta, order=order)


def check_patches_active(report: Mapping[str, Any], patches: Mapping[str, str], where: str) -> None:
    """Every declared patch must have run during the call: its reported call count is above zero."""
    if not patches:
        return
    counts = report.get("patch_calls")
    for name in patches:
        count = counts.get(name) if isinstance(counts, dict) else None
        if not isinstance(count, int) or count <= 0:
            raise EvidenceError(f"{where}: patch {name!r} reports {count!r} calls: it was not active in this call, "
                                "so the evidence is not of the patched package")


@dataclass(frozen=True)
class Difference:
    """The first place a value differs from the one expected (a contract's, a recomputed one), for the check that
    found it to say in its own words: admission of a record, verification of a receipt, a worker's identity."""

    where: str
    """The path to it from the values compared: `package.settings.threads`, `params.requests[5].seed`."""
    kind: Literal["missing", "unexpected", "length", "type", "value"]
    """`missing`: a key of the expected map only; `unexpected`: a key of the actual map only; `length`: two lists of
    other lengths, equal as far as the shorter goes; `type`: values of other types (1, 1.0 and true are three, an
    array and a list two); `value`: other values of one type (arrays: another dtype, shape or bytes)."""
    expected: Any
    """The expected value at `where` (None where `unexpected`)."""
    actual: Any
    """The actual value at `where` (None where `missing`)."""

    def said(self, words: Mapping[str, Callable[[Difference], str]]) -> str:
        """This difference in a check's own words: `words[kind]`, or `words["other"]` for a kind the check does not
        tell apart."""
        return words.get(self.kind, words["other"])(self)


def first_difference(expected: Any, actual: Any, where: str) -> Difference | None:
    """The first place `actual` differs from `expected`, walking maps in sorted key order and lists element by
    element (then their lengths), comparing types as well as values; None where they are equal."""
    if isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):
        if not isinstance(expected, np.ndarray) or not isinstance(actual, np.ndarray):
            return Difference(where, "type", expected, actual)
        same = expected.dtype == actual.dtype and expected.shape == actual.shape and \
            expected.tobytes() == actual.tobytes()
        return None if same else Difference(where, "value", expected, actual)
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in actual:
                return Difference(f"{where}.{key}", "missing", expected[key], None)
            if key not in expected:
                return Difference(f"{where}.{key}", "unexpected", None, actual[key])
            if (found := first_difference(expected[key], actual[key], f"{where}.{key}")) is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            if (found := first_difference(e, a, f"{where}[{i}]")) is not None:
                return found
        return None if len(expected) == len(actual) else Difference(where, "length", expected, actual)
    if type(expected) is not type(actual):
        return Difference(where, "type", expected, actual)
    return None if expected == actual else Difference(where, "value", expected, actual)
