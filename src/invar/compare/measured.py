"""A use run's measurements (plan `invar.plan/3`), compared: the units the plan measured, the candidate's teacher
forcing, and the captures of both packages streamed from the store.

Admission binds each measurement record to its planned call and keeps only what is small (`MeasurementRecord`:
per item, the unit, its per-token log-probabilities, its capture steps); the captures are read again here, straight
from the store, the reference's and the candidate's side by side (`record_captures`), and dropped once compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from invar.compare.metrics import CaptureComparison
from invar.compare.numerical import (
    Capture,
    CaptureContext,
    InputError,
    NumericalComparison,
    Response,
    StreamedComparison,
    UnitPair,
    UnitResult,
    compare,
    compare_captures,
    compare_unit,
    zip_captures,
)
from invar.compare.outputs import KlRequirementOutput
from invar.errors import EvidenceError
from invar.evidence import EvidenceOutput
from invar.records import RunStore

Role = Literal["reference", "candidate"]


@dataclass(frozen=True)
class MeasuredItem:
    """One scored item of a measurement call."""

    unit: int
    """The plan's unit index."""
    logprobs: np.ndarray
    """float32[T], an owned copy."""
    steps: tuple[int, ...]
    vocab_size: int | None


@dataclass(frozen=True)
class MeasurementRecord:
    """A planned measurement call and the record that answered it (its captures stay in the store)."""

    key: str
    package: Role
    source: Role
    record_seq: int
    report_seq: int
    call_id: int
    call_digest: str
    report_digest: str
    items: tuple[MeasuredItem, ...]

    @property
    def name(self) -> str:
        return f"record {self.record_seq} (call {self.call_id}, score, {self.call_digest[:12]}…)"

    def output(self) -> EvidenceOutput:
        """What a decision prints of it, as of a generate call's."""
        return EvidenceOutput(call=self.key, record=self.record_seq, call_id=self.call_id,
                              call_digest=self.call_digest, report_digest=self.report_digest)


def record_captures(store: RunStore, records: Sequence[MeasurementRecord],
                    unit_ids: Sequence[str] | Mapping[int, str]) -> Iterator[Capture]:
    """Stream `store` and yield the captures of the items of `records` (all of one package), each a view of its
    record valid until the next; a record whose report is not the one bound before is refused."""
    wanted = {r.report_seq: r for r in records}
    stream = store.stream()
    for rec in stream:
        if rec.report is None or rec.report.seq not in wanted:
            continue
        bound = wanted.pop(rec.report.seq)
        if rec.report.report_digest != bound.report_digest:
            raise EvidenceError(f"{bound.name}: its report changed since it was bound; decide the run again")
        result = rec.report.report.result
        assert result is not None
        for item, out in zip(bound.items, result["outputs"], strict=True):
            if item.steps:
                yield Capture(unit_ids[item.unit], item.steps, out["vocab_logprobs"])
    if wanted:
        raise EvidenceError(f"{next(iter(wanted.values())).name}: its report is gone from the store; decide the run "
                            "again")


def measured_comparison(
    store: RunStore, unit_ids: Sequence[str], prompts: Sequence[str], outputs: Mapping[Role, Sequence[Response]],
    records: Sequence[MeasurementRecord], *, teacher_forcing: bool, texts: Mapping[Role, Sequence[str | None]],
    losses: Mapping[Role, Sequence[int | None]], large_step: float, sources: dict[str, Any],
) -> NumericalComparison:
    """Every unit's sampled responses (pairing layout) compared and, on the units measured, the candidate's teacher
    forcing (with it on) and the captures of both packages, streamed from `store`."""
    items: dict[tuple[Role, int], MeasuredItem] = {}
    for r in records:
        for it in r.items:
            items[(r.package, it.unit)] = it
    pairs = []
    for u in range(len(unit_ids)):
        cand_item, ref_item = items.get(("candidate", u)), items.get(("reference", u))
        pairs.append(UnitPair(
            unit_ids[u], prompts[u], outputs["reference"][u], outputs["candidate"][u],
            losses["reference"][u], losses["candidate"][u], texts["reference"][u], texts["candidate"][u],
            teacher_forced=cand_item.logprobs if teacher_forcing and cand_item is not None else None,
            reference_scored=None if ref_item is None else ref_item.logprobs,
        ))
    by_role: dict[Role, list[MeasurementRecord]] = {"reference": [], "candidate": []}
    for r in records:
        by_role[r.package].append(r)
    captures = None
    if any(it.steps for it in items.values()):
        captures = zip_captures(record_captures(store, by_role["reference"], unit_ids),
                                record_captures(store, by_role["candidate"], unit_ids))
    return compare(pairs, captures, context="reference" if teacher_forcing else "own", large_step=large_step,
                   sources=sources)


PairAt = Callable[[int, "MeasuredItem | None", "MeasuredItem | None"], UnitPair]
"""Unit `u`'s pair, given the candidate's and the reference's measured item of it (None where not measured)."""


def streamed_comparison(
    store: RunStore, n: int, pair_at: PairAt, unit_id_at: Callable[[int], str], records: Sequence[MeasurementRecord],
    *, teacher_forcing: bool, large_step: float, sources: dict[str, Any],
    row: Callable[[UnitResult], object] = lambda u: None,
) -> StreamedComparison:
    """`measured_comparison`'s numbers with its units streamed: each of the `n` units' pair is made when compared
    (`pair_at`), its row handed to `row` and dropped; the captures (on the measured units only) are compared first,
    streamed from `store`. The same aggregates, rows and order as `measured_comparison` of the same units."""
    items: dict[tuple[Role, int], MeasuredItem] = {}
    for r in records:
        for it in r.items:
            items[(r.package, it.unit)] = it

    def pair(u: int) -> UnitPair:
        cand_item, ref_item = items.get(("candidate", u)), items.get(("reference", u))
        return pair_at(u, cand_item if teacher_forcing else None, ref_item)

    context: CaptureContext = "reference" if teacher_forcing else "own"
    compared: dict[str, tuple[CaptureComparison, ...]] = {}
    if any(it.steps for it in items.values()):
        measured = {u: unit_id_at(u) for _, u in items}
        index = {uid: u for u, uid in measured.items()}
        by_role: dict[Role, list[MeasurementRecord]] = {"reference": [], "candidate": []}
        for r in records:
            by_role[r.package].append(r)
        for ref_cap, cand_cap in zip_captures(record_captures(store, by_role["reference"], measured),
                                              record_captures(store, by_role["candidate"], measured)):
            at = index.get(ref_cap.unit_id)
            if at is None:
                raise InputError(f"unit {ref_cap.unit_id}: captured, but not among the units compared")
            compared[ref_cap.unit_id] = compare_captures(pair(at), ref_cap, cand_cap, context)
    result = StreamedComparison(large_step, context if compared else None, sources, row)
    for u in range(n):
        p = pair(u)
        result.add(compare_unit(p, compared.pop(p.unit_id, ()), large_step))
    return result


@dataclass(frozen=True)
class KlRequirement:
    """Whether every capture's KL(reference ‖ candidate) is within the contract's `max_kl`."""

    max_kl: Decimal
    holds: bool
    """Every capture's KL plus its error bound is at most max_kl."""
    violated: bool
    """Some capture's KL minus its error bound exceeds max_kl: a definite breach."""
    captures: int
    worst: str | None
    """The capture that decides, described."""

    def output(self) -> KlRequirementOutput:
        """What a decision prints of it."""
        return KlRequirementOutput(max_kl=str(self.max_kl), holds=self.holds, violated=self.violated,
                                   captures=self.captures, worst=self.worst)


def kl_requirement(result: NumericalComparison, max_kl: Decimal) -> KlRequirement:
    """Check every capture against `max_kl` exactly (as fractions), allowing each KL its numerical error bound."""
    limit = Fraction(max_kl)
    over: tuple[Fraction, str] | None = None
    unsure: tuple[Fraction, str] | None = None
    count = 0
    for u in result.units:
        for c in u.captures:
            count += 1
            where = (f"unit {u.unit_id} step {c.step}: KL(reference ‖ candidate) = {c.kl_ref_cand:.6g} nats "
                     f"(numerical error ≤ {c.bound_ref_cand:.3g})")
            if math.isinf(c.kl_ref_cand) or math.isinf(c.bound_ref_cand):
                low = Fraction(10**400) if math.isinf(c.kl_ref_cand) else Fraction(0)
                high = Fraction(10**400)
            else:
                low = Fraction(c.kl_ref_cand) - Fraction(c.bound_ref_cand)
                high = Fraction(c.kl_ref_cand) + Fraction(c.bound_ref_cand)
            if low > limit and (over is None or low > over[0]):
                over = (low, where)
            elif high > limit and (unsure is None or high > unsure[0]):
                unsure = (high, where)
    worst = over[1] if over is not None else unsure[1] if unsure is not None else None
    return KlRequirement(max_kl, over is None and unsure is None, over is not None, count, worst)


__all__ = [
    "KlRequirement",
    "MeasuredItem",
    "MeasurementRecord",
    "kl_requirement",
    "measured_comparison",
    "record_captures",
]
