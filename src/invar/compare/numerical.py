"""A numerical comparison of a reference and a candidate over many units, streamed unit by unit.

Every number comes from the records: each unit's two sampled responses, the candidate's teacher-forced scoring of
the reference's response, and whole-vocabulary captures from both sides at chosen steps. Only scalars are kept per
unit; the captures, the one part that grows with the vocabulary, are consumed as they stream from the store and
dropped (`zip_captures`), so memory follows the number of units, not the number of units × the vocabulary.

Pure: the caller supplies the units and the capture streams (`invar.compare.runs` reads them from run stores).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

from invar.compare.metrics import (
    CaptureComparison,
    Distribution,
    SequenceComparison,
    compare_capture,
    compare_sequences,
    distribution,
    first_large_step,
    fraction_and_uncertainty,
    rms_and_uncertainty,
    teacher_forced_deltas,
)
from invar.compare.outputs import (
    CaptureStep,
    CaptureSummary,
    CompareDecision,
    CompareNumericalOutput,
    ComparisonBody,
    DistributionOutput,
    GenerationSummary,
    KlDistributionOutput,
    PositionsOutput,
    RmsOutput,
    SameTopOutput,
    SelfConsistency,
    StepDeltas,
    TaskSummary,
    TeacherForcingSummary,
    UnitComparison,
    UnitTeacherForcing,
)

DEFAULT_LARGE_STEP = 0.01
"""|Δ| in nats above which a teacher-forced step counts as a large difference (`--large-step`)."""

CaptureContext = Literal["reference", "own"]
"""Where the captures were taken: both along the reference's response (teacher forcing), or each package along
its own response (then only steps within the shared prefix see the same context and are compared)."""


@dataclass(frozen=True)
class Response:
    """One sampled response as reported: token ids int32[T], log-probabilities float32[T] (nats), finish reason."""

    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: str


@dataclass(frozen=True)
class UnitPair:
    """Everything one unit's comparison needs besides its captures."""

    unit_id: str
    prompt: str
    reference: Response
    candidate: Response
    reference_loss: int | None = None
    candidate_loss: int | None = None
    reference_text: str | None = None
    candidate_text: str | None = None
    teacher_forced: np.ndarray | None = None
    """The candidate's log-probabilities (float32[T_ref]) of the reference's tokens, on the reference's context."""
    reference_scored: np.ndarray | None = None
    """The reference's own teacher-forced log-probabilities of its response (float32[T_ref]), when it scored it."""
    expected: str | None = None
    """The unit's expected answer as its scorer reads it, for the reader (None when unknown)."""


@dataclass(frozen=True)
class Capture:
    """Whole-vocabulary log-probabilities of one unit at some steps: float[k, V], one row per step."""

    unit_id: str
    steps: tuple[int, ...]
    values: np.ndarray


@dataclass(frozen=True)
class TeacherForcing:
    """The candidate's reading of the reference's response against the reference's own, step by step."""

    deltas: np.ndarray
    """float64[T]: candidate − reference log-probability of the reference's token, nats."""
    identical: bool
    """Every step's two log-probabilities have the same bits."""
    first_large: int | None
    """First step with |Δ| above the threshold, or None."""

    @property
    def max_abs(self) -> float:
        return float(np.abs(self.deltas).max()) if self.deltas.size else 0.0

    def output(self) -> UnitTeacherForcing:
        """What a unit's row prints of it."""
        return UnitTeacherForcing(identical=self.identical, first_large_step=self.first_large,
                                  max_abs_delta=self.max_abs, sum_delta=float(self.deltas.sum()),
                                  deltas=[float(x) for x in self.deltas])


@dataclass(frozen=True)
class UnitResult:
    """One unit, compared."""

    unit_id: str
    prompt: str
    reference_text: str | None
    candidate_text: str | None
    reference_tokens: tuple[int, ...]
    candidate_tokens: tuple[int, ...]
    sequence: SequenceComparison
    reference_loss: int | None
    candidate_loss: int | None
    teacher: TeacherForcing | None
    captures: tuple[CaptureComparison, ...]
    reference_self_identical: bool | None
    """The reference's own teacher-forced scores equal the log-probabilities it sampled with, bit for bit (None:
    it did not score its response)."""
    expected: str | None = None
    """The unit's expected answer, for the reader (None when unknown)."""

    @property
    def max_kl(self) -> float:
        return max((c.kl_ref_cand for c in self.captures), default=0.0)

    def output(self) -> UnitComparison:
        """The unit's row of `compare numerical --json` (and of the worst units)."""
        s = self.sequence
        return UnitComparison(
            unit_id=self.unit_id, prompt=self.prompt, expected=self.expected, reference_text=self.reference_text,
            candidate_text=self.candidate_text, first_divergence=s.first_divergence, shared=s.shared,
            tokens_identical=s.tokens_identical, logprobs_identical=s.logprobs_identical, identical=s.identical,
            max_ulp=s.max_ulp, max_abs_delta=s.max_abs_delta, sum_delta=s.sum_delta,
            reference_loss=self.reference_loss, candidate_loss=self.candidate_loss,
            teacher_forcing=None if self.teacher is None else self.teacher.output(),
            captures=[c.output() for c in self.captures], reference_self_identical=self.reference_self_identical)


class InputError(ValueError):
    """Inputs that cannot be compared (a capture of another vocabulary size, a step past a response's end…);
    the message names the unit."""


def zip_captures(reference: Iterable[Capture], candidate: Iterable[Capture]) -> Iterator[tuple[Capture, Capture]]:
    """Pair two capture streams by unit, reading them alternately; only a capture whose partner has not arrived yet
    is held (none when both streams list units in the same order). `InputError` for a unit only one side has."""
    held: tuple[dict[str, Capture], dict[str, Capture]] = ({}, {})
    streams = (iter(reference), iter(candidate))
    alive = [True, True]
    while any(alive):
        for side in (0, 1):
            if not alive[side]:
                continue
            item = next(streams[side], None)
            if item is None:
                alive[side] = False
                continue
            other = held[1 - side].pop(item.unit_id, None)
            if other is None:
                if item.unit_id in held[side]:
                    raise InputError(f"unit {item.unit_id}: captured twice by the "
                                     f"{('reference', 'candidate')[side]}")
                held[side][item.unit_id] = item
            else:
                yield (item, other) if side == 0 else (other, item)
    for side, name in ((0, "reference"), (1, "candidate")):
        if held[side]:
            unit = next(iter(held[side]))
            raise InputError(f"unit {unit}: the {name} has captures and the "
                             f"{('candidate', 'reference')[side]} has none")


def compare_captures(pair: UnitPair, reference: Capture, candidate: Capture,
                     context: CaptureContext) -> tuple[CaptureComparison, ...]:
    """The captures of one unit, step by step. `context` says where they were taken (see `CaptureContext`)."""
    where = f"unit {pair.unit_id}"
    for cap, name in ((reference, "reference"), (candidate, "candidate")):
        if cap.values.ndim != 2 or cap.values.shape[0] != len(cap.steps):
            raise InputError(f"{where}: the {name} capture has shape {cap.values.shape} for {len(cap.steps)} steps")
    if reference.values.shape[1] != candidate.values.shape[1]:
        raise InputError(f"{where}: the reference's capture covers a vocabulary of {reference.values.shape[1]} "
                         f"tokens, the candidate's {candidate.values.shape[1]}; compare packages of one vocabulary")
    ref_tokens = pair.reference.tokens
    for cap, name, length in ((reference, "reference", len(ref_tokens)),
                              (candidate, "candidate", len(ref_tokens) if context == "reference"
                               else len(pair.candidate.tokens))):
        beyond = [s for s in cap.steps if not 0 <= s < length]
        if beyond:
            raise InputError(f"{where}: the {name} capture is at step {beyond[0]}, beyond the response's end "
                             f"({length} tokens, steps 0–{length - 1})")
    if context == "reference":
        if reference.steps != candidate.steps:
            raise InputError(f"{where}: captured at steps {list(reference.steps)} by the reference and "
                             f"{list(candidate.steps)} by the candidate; both must capture the same steps")
        steps = list(reference.steps)
    else:
        # Each side's distribution at step s conditions on its own tokens before s: the same context only up to
        # the first divergence.
        fd = pair_first_divergence(pair)
        steps = [s for s in reference.steps if s in candidate.steps and (fd is None or s <= fd)]
    out = []
    for s in steps:
        r = reference.values[reference.steps.index(s)]
        c = candidate.values[candidate.steps.index(s)]
        try:
            out.append(compare_capture(s, r, c, int(ref_tokens[s])))
        except ValueError as exc:
            raise InputError(f"{where}, step {s}: {exc}") from None
    return tuple(out)


def pair_first_divergence(pair: UnitPair) -> int | None:
    return compare_sequences(pair.reference.tokens, pair.reference.logprobs, pair.candidate.tokens,
                             pair.candidate.logprobs).first_divergence


def compare_unit(pair: UnitPair, captures: tuple[CaptureComparison, ...] = (),
                 large_step: float = DEFAULT_LARGE_STEP) -> UnitResult:
    """One unit: its two responses, the teacher forcing, and its (already compared) captures."""
    ref, cand = pair.reference, pair.candidate
    seq = compare_sequences(ref.tokens, ref.logprobs, cand.tokens, cand.logprobs, ref.finish_reason,
                            cand.finish_reason)
    teacher = None
    if pair.teacher_forced is not None:
        if pair.teacher_forced.shape != ref.logprobs.shape:
            raise InputError(f"unit {pair.unit_id}: the candidate scored {pair.teacher_forced.size} steps of a "
                             f"{ref.logprobs.size}-token reference response")
        deltas = teacher_forced_deltas(ref.logprobs, pair.teacher_forced)
        teacher = TeacherForcing(deltas, bool(np.array_equal(ref.logprobs.view(np.uint32),
                                                             pair.teacher_forced.view(np.uint32))),
                                 first_large_step(deltas, large_step))
    self_identical = None
    if pair.reference_scored is not None:
        self_identical = pair.reference_scored.shape == ref.logprobs.shape and bool(
            np.array_equal(pair.reference_scored.view(np.uint32), ref.logprobs.view(np.uint32)))
    return UnitResult(pair.unit_id, pair.prompt, pair.reference_text, pair.candidate_text,
                      tuple(int(t) for t in ref.tokens), tuple(int(t) for t in cand.tokens), seq,
                      pair.reference_loss, pair.candidate_loss, teacher, captures, self_identical, pair.expected)


def _positions(values: Iterable[int | None]) -> PositionsOutput:
    counts = Counter(values)
    none = counts.pop(None, 0)
    return PositionsOutput(none=none, positions={str(k): counts[k] for k in sorted(counts)})  # type: ignore[type-var]


def _distribution(values: Iterable[float] | np.ndarray) -> DistributionOutput | None:
    d = distribution(values if isinstance(values, np.ndarray) else list(values))
    return None if d is None else d.output()


@dataclass(frozen=True)
class NumericalComparison:
    """Every unit compared, and the aggregates: those of a `StreamedComparison` fed every unit in order (one
    computation of them), with every unit's row beside them."""

    units: tuple[UnitResult, ...]
    large_step: float
    context: CaptureContext | None
    sources: dict[str, Any] = field(default_factory=dict)
    """What was compared (runs, heads, packages), for the reader."""
    decision: CompareDecision | None = None
    """A use run's decision under its contract (`use admit`'s answer, reason and bound), for the report's headline;
    None for two runs compared by their records alone."""

    @cached_property
    def _fed(self) -> StreamedComparison:
        fed = StreamedComparison(self.large_step, self.context)
        for u in self.units:
            fed.add(u)
        return fed

    # -- aggregates ----------------------------------------------------------------------------------------------

    @property
    def captures(self) -> list[CaptureComparison]:
        return [c for u in self.units for c in u.captures]

    def generation(self) -> GenerationSummary:
        return self._fed.generation()

    def task(self) -> TaskSummary | None:
        return self._fed.task()

    def teacher_forcing(self) -> TeacherForcingSummary | None:
        return self._fed.teacher_forcing()

    def capture_summary(self) -> CaptureSummary | None:
        return self._fed.capture_summary()

    def reference_self_consistency(self) -> SelfConsistency | None:
        return self._fed.reference_self_consistency()

    def worst(self, count: int = 10) -> list[UnitResult]:
        """The `count` units that part most: largest KL(ref ‖ cand) at a capture, then largest teacher-forced |Δ|,
        then earliest first divergence, then largest |Δ| over the shared prefix. Every unit is held, so any count."""
        return _worst_of(self.units, count)

    def body(self) -> ComparisonBody:
        """The aggregates as printed: the report less its per-unit rows."""
        return self._fed.body(self.sources)

    def output(self) -> CompareNumericalOutput:
        """What `compare numerical --json` prints: the aggregates, every unit's row and the decision."""
        return CompareNumericalOutput(**dict(self.body()), units=[u.output() for u in self.units],
                                      decision=self.decision)


def _capture_summary(caps: list[CaptureComparison], context: CaptureContext | None,
                     units: int) -> CaptureSummary | None:
    """The captures' aggregates (`units`: how many units have captures)."""
    if not caps:
        return None
    n = len(caps)
    same = sum(c.same_top for c in caps)
    top, top_err = fraction_and_uncertainty(same, n)
    dps = [c.delta_p for c in caps]
    rms, rms_err = rms_and_uncertainty(dps)
    delta_p = _distribution(dps)
    assert delta_p is not None
    assert context is not None
    return CaptureSummary(
        captures=n, context=context, units=units, identical=sum(c.identical for c in caps),
        indistinguishable_from_0=sum(c.indistinguishable for c in caps),
        kl_ref_cand=_kl([c.kl_ref_cand for c in caps], [c.bound_ref_cand for c in caps]),
        kl_cand_ref=_kl([c.kl_cand_ref for c in caps], [c.bound_cand_ref for c in caps]),
        same_top=SameTopOutput(count=same, fraction=top, stderr=top_err), delta_p=delta_p,
        rms_delta_p=RmsOutput(value=rms, stderr=rms_err), by_step=_by_step(caps))


def _kl(values: list[float], bounds: list[float]) -> KlDistributionOutput:
    """A KL divergence per capture, with the mean and largest of their numerical error bounds."""
    d = distribution(values)
    assert d is not None
    mean_bound = float(np.mean(bounds))
    return KlDistributionOutput(**dict(d.output()), mean_bound=mean_bound, max_bound=max(bounds),
                                mean_indistinguishable_from_0=abs(d.mean) <= mean_bound)


def _worst_key(u: UnitResult) -> tuple[float, float, float, float]:
    fd = u.sequence.first_divergence
    return (u.max_kl, u.teacher.max_abs if u.teacher is not None else 0.0,
            -float(fd) if fd is not None else -float("inf"), u.sequence.max_abs_delta)


def _may_be_worst(u: UnitResult) -> bool:
    """Whether a unit is a worst-unit candidate: it parts from the reference, or a capture's KL is above 0."""
    return not u.sequence.identical or bool(u.captures and u.max_kl > 0)


def _worst_of(units: Iterable[UnitResult], count: int) -> list[UnitResult]:
    """The `count` worst candidates of `units`, worst first (a stable sort: equal keys keep the units' order)."""
    if count < 0:
        raise ValueError(f"worst units: count {count} is negative")
    return sorted((u for u in units if _may_be_worst(u)), key=_worst_key, reverse=True)[:count]


class StreamedComparison:
    """A comparison whose units stream past one at a time (`add`): each unit's row goes to `row` as it is compared
    and only what the aggregates need is kept (per unit a few scalars and the teacher-forced deltas; the captures'
    comparisons; the `keep_worst` worst units so far, ten unless asked). A `NumericalComparison` is one fed every
    unit, so the aggregates and `body()` of the two are the same computation on the same units, and a report of a
    million units is written without holding a million rows."""

    _PRUNE = 4096
    """Worst-unit candidates held before they are cut back to the `keep_worst` worst (at least twice that many)."""

    def __init__(self, large_step: float, context: CaptureContext | None, sources: dict[str, Any] | None = None,
                 row: Callable[[UnitResult], object] = lambda u: None, keep_worst: int = 10) -> None:
        if keep_worst < 0:
            raise ValueError(f"a streamed comparison keeps a number of worst units, not {keep_worst}")
        self.large_step = large_step
        self.context = context
        self.sources: dict[str, Any] = dict(sources or {})
        self.decision: CompareDecision | None = None
        """As `NumericalComparison.decision`."""
        self._row = row
        self._n = self._identical = self._tokens_identical = self._logprobs_identical = self._shared = 0
        self._first_divergence: Counter[int | None] = Counter()
        self._max_ulp, self._max_abs, self._sum_delta = array("d"), array("d"), array("d")
        self._scored = self._ref_loss = self._cand_loss = self._worse = self._better = 0
        self._taught = self._taught_identical = 0
        self._first_large: Counter[int | None] = Counter()
        # Every teacher-forced delta in unit order (chunks joined as they fill) and each taught unit's step count.
        self._deltas: list[np.ndarray] = []
        self._pending: list[np.ndarray] = []
        self._widths = array("q")
        self._captures: list[CaptureComparison] = []
        self._captured_units = 0
        self._checked = self._self_identical = 0
        self._worst: list[UnitResult] = []
        self._keep_worst = keep_worst
        self._cut_at = max(self._PRUNE, 2 * keep_worst)

    def add(self, u: UnitResult) -> None:
        """Take one compared unit (in the report's unit order), hand its row to `row`, keep its scalars."""
        self._row(u)
        s = u.sequence
        self._n += 1
        self._identical += s.identical
        self._tokens_identical += s.tokens_identical
        self._first_divergence[s.first_divergence] += 1
        if s.shared > 0:
            self._shared += 1
            self._logprobs_identical += s.logprobs_identical
            self._max_ulp.append(float(s.max_ulp))
            self._max_abs.append(s.max_abs_delta)
            self._sum_delta.append(s.sum_delta)
        if u.reference_loss is not None and u.candidate_loss is not None:
            r, c = u.reference_loss, u.candidate_loss
            self._scored += 1
            self._ref_loss += r
            self._cand_loss += c
            self._worse += c > r
            self._better += c < r
        if u.teacher is not None:
            self._taught += 1
            self._taught_identical += u.teacher.identical
            self._first_large[u.teacher.first_large] += 1
            self._pending.append(u.teacher.deltas)
            self._widths.append(u.teacher.deltas.size)
            if len(self._pending) >= self._PRUNE:
                self._deltas.append(np.concatenate(self._pending))
                self._pending = []
        if u.captures:
            self._captures.extend(u.captures)
            self._captured_units += 1
        if u.reference_self_identical is not None:
            self._checked += 1
            self._self_identical += u.reference_self_identical
        if _may_be_worst(u):
            self._worst.append(u)
            if len(self._worst) >= self._cut_at:
                # A stable sort keeps the order of equal keys, and the kept come before later units: the same ones
                # as sorting every candidate at the end.
                self._worst = _worst_of(self._worst, self._keep_worst)

    # -- the aggregates, as `NumericalComparison` computes them --------------------------------------------------

    @property
    def captures(self) -> list[CaptureComparison]:
        return list(self._captures)

    def generation(self) -> GenerationSummary:
        n = self._n

        def dist(values: array[float]) -> DistributionOutput | None:
            return _distribution(np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0))

        return GenerationSummary(
            units=n, identical=self._identical, fraction_identical=self._identical / n if n else 0.0,
            tokens_identical=self._tokens_identical, logprobs_identical_over_shared_prefix=self._logprobs_identical,
            with_shared_prefix=self._shared, first_divergence=_positions(self._first_divergence.elements()),
            max_ulp=dist(self._max_ulp), max_abs_delta=dist(self._max_abs), sum_delta=dist(self._sum_delta))

    def task(self) -> TaskSummary | None:
        if not self._scored:
            return None
        return TaskSummary(units=self._scored, reference_loss=self._ref_loss, candidate_loss=self._cand_loss,
                           worse=self._worse, better=self._better)

    def _every_delta(self) -> np.ndarray:
        if self._pending:
            self._deltas.append(np.concatenate(self._pending))
            self._pending = []
        if len(self._deltas) > 1:
            self._deltas = [np.concatenate(self._deltas)]
        return self._deltas[0] if self._deltas else np.zeros(0)

    def teacher_forcing(self) -> TeacherForcingSummary | None:
        if not self._taught:
            return None
        every = self._every_delta()
        widths = np.frombuffer(self._widths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(widths)[:-1]])
        per_step = []
        for s in range(int(widths.max())):
            col = np.ascontiguousarray(every[starts[widths > s] + s])  # step s of each unit that has it, in order
            per_step.append(StepDeltas(step=s, n=int(col.size), mean=float(col.mean()),
                                       mean_abs=float(np.abs(col).mean()), max_abs=float(np.abs(col).max())))
        return TeacherForcingSummary(
            units=self._taught, identical=self._taught_identical, large_step=self.large_step,
            first_large_step=_positions(self._first_large.elements()), delta=_distribution(every),
            abs_delta=_distribution(np.abs(every)), per_step=per_step)

    def capture_summary(self) -> CaptureSummary | None:
        if not self._captures:
            return None
        return _capture_summary(self._captures, self.context, self._captured_units)

    def reference_self_consistency(self) -> SelfConsistency | None:
        if not self._checked:
            return None
        return SelfConsistency(units=self._checked, identical=self._self_identical)

    def worst(self, count: int = 10) -> list[UnitResult]:
        """The `count` worst units of those streamed past, as `NumericalComparison.worst`; refused beyond the
        `keep_worst` the comparison keeps (the others were let go as they came)."""
        if count > self._keep_worst:
            raise ValueError(f"a streamed comparison keeps its {self._keep_worst} worst units, not {count}: build "
                             f"it with keep_worst={count} to ask for {count}")
        return _worst_of(self._worst, count)

    def body(self, sources: dict[str, Any] | None = None) -> ComparisonBody:
        """The aggregates as printed: the report less its per-unit rows (they went to `row`). `sources`: another
        comparison's, where it is fed that one's units."""
        return ComparisonBody(
            sources=self.sources if sources is None else sources, generation=self.generation(), task=self.task(),
            teacher_forcing=self.teacher_forcing(), captures=self.capture_summary(),
            reference_self_consistency=self.reference_self_consistency(), worst=[u.output() for u in self.worst()])

    def output(self) -> CompareNumericalOutput:
        """What `compare numerical --json` prints, its `units` empty: the rows went to `row` as they came, and the
        command prints them in their place."""
        return CompareNumericalOutput(**dict(self.body()), units=[], decision=self.decision)


Comparison = NumericalComparison | StreamedComparison
"""A comparison as the report and the CLI read it: every unit held, or its units streamed past."""


def _by_step(caps: list[CaptureComparison]) -> list[CaptureStep]:
    steps: dict[int, list[CaptureComparison]] = {}
    for c in caps:
        steps.setdefault(c.step, []).append(c)
    return [CaptureStep(step=s, n=len(group), mean_kl_ref_cand=float(np.mean([c.kl_ref_cand for c in group])),
                        max_kl_ref_cand=max(c.kl_ref_cand for c in group),
                        mean_bound_ref_cand=float(np.mean([c.bound_ref_cand for c in group])),
                        indistinguishable_from_0=sum(c.indistinguishable for c in group),
                        same_top=sum(c.same_top for c in group))
            for s, group in ((s, steps[s]) for s in sorted(steps))]


def compare(pairs: Iterable[UnitPair], captures: Iterable[tuple[Capture, Capture]] | None = None, *,
            context: CaptureContext | None = "reference", large_step: float = DEFAULT_LARGE_STEP,
            sources: dict[str, Any] | None = None) -> NumericalComparison:
    """Compare every unit of `pairs`; `captures` (from `zip_captures`) are consumed as they stream, each unit's
    compared at once and dropped. `InputError` names the unit of anything that cannot be compared."""
    units = {p.unit_id: p for p in pairs}
    compared: dict[str, tuple[CaptureComparison, ...]] = {}
    if captures is not None:
        assert context is not None
        for ref_cap, cand_cap in captures:
            pair = units.get(ref_cap.unit_id)
            if pair is None:
                raise InputError(f"unit {ref_cap.unit_id}: captured, but not among the units compared")
            compared[ref_cap.unit_id] = compare_captures(pair, ref_cap, cand_cap, context)
    results = tuple(compare_unit(p, compared.get(uid, ()), large_step) for uid, p in units.items())
    return NumericalComparison(results, large_step, context if compared else None, dict(sources or {}))


__all__ = [
    "DEFAULT_LARGE_STEP",
    "Capture",
    "CaptureContext",
    "Comparison",
    "Distribution",
    "InputError",
    "NumericalComparison",
    "Response",
    "StreamedComparison",
    "TeacherForcing",
    "UnitPair",
    "UnitResult",
    "compare",
    "compare_captures",
    "compare_unit",
    "zip_captures",
]
