"""The decision of `use admit`: pure functions from the bound evidence and the contract to an answer and its reason.

The evidence is bound (`invar.contract.bind`) and the owner's inputs read (`invar.contract.inputs`) before any
rule here runs, so the rules can be read, tested and replayed on their own: `decide` is pure, and the rest read
only through the bound evidence (a call's outputs, read again from the open store when binding kept none) or, in
`check_premises`, re-hash the basis file a `checked` premise declares. The losses are recomputed here from the
response tokens with the core's own detokenizer and the contract's scorer, never read from a number a worker
computed.

The decision, in order:
1. Invariance (if the contract requires it): the candidate's runs under the declared layouts give bit-identical
   tokens and log-probabilities for every unit. Any difference is a definite breach: Violated. Relative to the
   reference (`invariance.relative_to`), only the units the reference gives bit-identical outputs for across the
   layouts are covered, and a candidate that differs on any of them is Violated: it added layout dependence.
1b. Determinism (if the contract requires it): the candidate's later runs of the determinism layout, each in a
   fresh worker, give bit-identical tokens and log-probabilities to its first run for every unit (relative to the
   reference, every unit the reference reproduces). Any difference is a definite breach: Violated.
2. Premises: each has its declared reliance (a `checked` basis file still hashes to its digest). A premise that
   does not hold leaves the decision without a basis it declared: Unknown.
3. The task loss. Population standard: the contract's bound on the mean paired difference (candidate loss minus
   reference loss) at confidence 1 − δ; upper ≤ ε → Admitted, lower > ε → Violated, otherwise Unknown.
   Finite-domain standard: the exact mean difference over exactly the declared units (a fraction), ≤ ε →
   Admitted, otherwise Violated; no bound and no claim beyond those units.
   Losses are 0/1 for a binary scorer. A scorer declared with `binary = false` and `loss_range = [a, b]` gives
   float losses in [a, b]; each difference then lies in [a − b, b − a], and the bound (a bounded-range method, as
   `use prepare` checked) is taken on that range. Sums and the mean difference are kept exactly either way.
Diagnostics (paired Wald, exact McNemar, Hoeffding; for losses in a range, paired Wald and Hoeffding) are computed on
the same differences and reported beside the decision; they never decide it.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.compare.measured import KlRequirement, MeasurementRecord
from invar.compare.numerical import NumericalComparison
from invar.contract.bind import CallEvidence, NonFiniteCall, Output
from invar.contract.model import Contract
from invar.contract.outputs import (
    DecisionContract,
    DecisionMeasurements,
    DecisionOutput,
    DeterminismOutput,
    InvarianceOutput,
    PremiseOutput,
)
from invar.contract.plan import ExecutionPlan, Role, Unit
from invar.errors import EvidenceError
from invar.evidence import RangeTaskLoss, TaskLoss, range_method, within_epsilon
from invar.evidence import task_bound as method_bound
from invar.formats.tokenizer import ModelTokenizer
from invar.stats.bounds import Bound, StatisticsError
from invar.stats.diagnostics import PairedDiagnostics, RangeDiagnostics
from invar.stats.sequential import SequentialDecision, check_stop, sequential_decision
from invar.tasks.scorers import Scorer

DECISION_VERSION = "invar.admit/1"
"""Names the decision procedure above; the bound method and its version are reported beside it."""


class Answer(enum.StrEnum):
    """The three answers of a use decision."""

    ADMITTED = "Admitted"
    VIOLATED = "Violated"
    UNKNOWN = "Unknown"


EXIT_CODES: Mapping[Answer, int] = {Answer.ADMITTED: 0, Answer.VIOLATED: 10, Answer.UNKNOWN: 11}
"""Exit status of `invar use admit` per answer; refused evidence or bad input exits 2 (`InvarError`)."""


@dataclass(frozen=True)
class Invariance:
    """Whether the candidate's outputs were bit-identical across the declared layouts (relative to the reference:
    whether the candidate added layout dependence on a unit the reference is invariant on)."""

    required: bool
    layouts: tuple[str, ...]
    holds: bool
    units: int
    units_differing: int
    """Units that break the requirement: that differ across layouts under the candidate (relative to the reference:
    and not under the reference)."""
    first_difference: str | None
    relative: RelativeInvariance | None = None
    """Invariance relative to the reference (`invariance.relative_to = "reference"`); None otherwise."""

    def output(self) -> InvarianceOutput:
        """What a decision prints of it; the relative counts only when relative to the reference, so decisions of
        other contracts keep their bytes."""
        shared = {"required": self.required, "layouts": list(self.layouts), "holds": self.holds,
                  "units": self.units, "units_differing": self.units_differing,
                  "first_difference": self.first_difference}
        r = self.relative
        if r is None:
            return InvarianceOutput(
                **shared, covers="only the layouts listed; the reference is not required to be invariant")
        return InvarianceOutput(
            **shared, covers=("only the layouts listed, and only the units the reference is invariant on; "
                              "units_differing counts those that gained layout dependence under the candidate"),
            relative_to="reference", reference_units_differing=r.reference_units_differing,
            candidate_units_differing=r.candidate_units_differing, gained_units=list(r.gained_units))


@dataclass(frozen=True)
class RelativeInvariance:
    """The counts of invariance relative to the reference: what each package does across the layouts, unit by unit."""

    reference_units_differing: int
    """Units whose outputs differ across the layouts under the reference: not covered by the requirement."""
    candidate_units_differing: int
    """Units whose outputs differ across the layouts under the candidate (gained or not)."""
    gained_units: tuple[str, ...]
    """The unit ids, in plan order, whose outputs are bit-identical across the layouts under the reference and
    differ under the candidate: the layout dependence the candidate added."""


_DETERMINISM_COVERS = ("only the layout listed, run again in a worker started afresh; other layouts and later runs are "
                      "not covered")
"""What the determinism requirement covers, as a decision prints it."""


def check_determinism(plan: ExecutionPlan, found: Mapping[str, CallEvidence], layout: str, runs: int,
                      relative: bool) -> DeterminismOutput:
    """Each later run of `layout` against the first, unit by unit, bit for bit (tokens, log-probability bits, finish
    reason), under the candidate and, `relative`, under the reference, whose varying units are then not counted.
    The check is its printed form: the decision reads the same fields it prints."""

    def varies(package: Role) -> np.ndarray:
        first = _output_digests(plan, found, package, layout)
        out = np.zeros(len(plan.units), dtype=bool)
        for run in range(2, runs + 1):
            out |= (_output_digests(plan, found, package, layout, run) != first).any(axis=1)
        return out

    candidate = varies("candidate")
    reference = varies("reference") if relative else np.zeros(len(plan.units), dtype=bool)
    counted = candidate & ~reference
    first = None
    if counted.any():
        i = int(np.flatnonzero(counted)[0])
        run = next(r for r in range(2, runs + 1)
                   if _output_difference(_layout_output(plan, found, "candidate", layout, i),
                                         _layout_output(plan, found, "candidate", layout, i, r)) is not None)
        what = _output_difference(_layout_output(plan, found, "candidate", layout, i),
                                  _layout_output(plan, found, "candidate", layout, i, run))
        first = f"unit {plan.units[i].unit_id}: {what} between runs 1 and {run} of layout {layout}"
        if relative:
            first += "; the reference reproduces it"
    return DeterminismOutput(
        required=True, layout=layout, runs=runs, holds=not counted.any(), units=len(plan.units),
        units_differing=int(counted.sum()), candidate_units_differing=int(candidate.sum()),
        relative_to="reference" if relative else None,
        reference_units_differing=int(reference.sum()) if relative else None, first_difference=first,
        differing_units=[plan.units[i].unit_id for i in np.flatnonzero(counted)], covers=_DETERMINISM_COVERS)


def check_invariance(runs: Mapping[str, Sequence[Output]]) -> tuple[int, str | None]:
    """Compare the candidate's outputs across layouts, unit by unit, bit for bit.

    `runs` maps layout name → outputs in request order (all the same length). Returns the number of units whose
    tokens, log-probability bits or finish reason differ between any two layouts, and a description of the
    first such difference.
    """
    names = list(runs)
    first = runs[names[0]]
    differing = 0
    description: str | None = None
    for i, base in enumerate(first):
        for name in names[1:]:
            other = runs[name][i]
            what = _output_difference(base, other)
            if what is not None:
                differing += 1
                if description is None:
                    head, _, detail = what.partition(" (")
                    description = f"unit {base.request_id}: {head} between layouts {names[0]} and {name}"
                    description += f" ({detail}" if detail else ""
                break
    return differing, description


def layout_invariance(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role, layouts: Sequence[str],
                      digests: Mapping[str, np.ndarray] | None = None) -> tuple[int, str | None]:
    """`check_invariance` of one package's outputs under `layouts`, read one call at a time: each unit's output is
    kept as a digest of its tokens, log-probability bits and finish reason, and only the first differing unit's two
    outputs are read again to describe the difference. The same count and description. `digests`: each layout's
    `output_digest` per unit (uint8[units, 32]) where a reader already took them as it bound the records."""
    names = list(layouts)
    digests = {name: digests[name] if digests is not None else _output_digests(plan, found, package, name)
               for name in names}
    differs = {name: (digests[name] != digests[names[0]]).any(axis=1) for name in names[1:]}
    if not differs:
        return 0, None
    any_differs = np.logical_or.reduce(list(differs.values()))
    differing = int(any_differs.sum())
    if not differing:
        return 0, None
    i = int(np.flatnonzero(any_differs)[0])
    name = next(n for n in names[1:] if differs[n][i])
    _, first = check_invariance({n: [_layout_output(plan, found, package, n, i)] for n in (names[0], name)})
    return differing, first


def relative_invariance(plan: ExecutionPlan, found: Mapping[str, CallEvidence], layouts: Sequence[str],
                        digests: Mapping[Role, Mapping[str, np.ndarray] | None]) -> Invariance:
    """Invariance relative to the reference over `layouts`: a unit breaks it when its reference outputs are
    bit-identical across the layouts and its candidate outputs are not. `digests`: per package, each layout's
    `output_digest` per unit where a reader already took them (None: read them here, one call at a time). The
    description is of the first such unit's first differing pair of candidate outputs."""
    names = list(layouts)

    def varies(package: Role) -> np.ndarray:
        known = digests.get(package)
        table = {n: known[n] if known is not None else _output_digests(plan, found, package, n) for n in names}
        return np.asarray(np.logical_or.reduce([(table[n] != table[names[0]]).any(axis=1) for n in names[1:]]),
                          dtype=bool)

    reference, candidate = varies("reference"), varies("candidate")
    gained = candidate & ~reference
    first = None
    if gained.any():
        i = int(np.flatnonzero(gained)[0])
        _, description = check_invariance({n: [_layout_output(plan, found, "candidate", n, i)] for n in names})
        first = f"{description}; the reference gives identical outputs across layouts {', '.join(names)}"
    relative = RelativeInvariance(int(reference.sum()), int(candidate.sum()),
                                  tuple(plan.units[i].unit_id for i in np.flatnonzero(gained)))
    return Invariance(True, tuple(names), not gained.any(), len(plan.units), int(gained.sum()), first, relative)


def _output_digests(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role, layout: str,
                    run: int = 1) -> np.ndarray:
    """uint8[units, 32]: per unit, sha256 of its output's token count, tokens, log-probability bits and finish."""
    out = np.zeros((len(plan.units), 32), dtype=np.uint8)
    for c in plan.layout_calls(package, layout, run):
        for index, o in zip(c.units, found[c.key].outputs, strict=True):
            out[index] = output_digest(o)
    return out


def output_digest(o: Output) -> np.ndarray:
    """uint8[32]: sha256 of an output's token count, tokens, log-probability bits and finish reason."""
    h = hashlib.sha256(len(o.tokens).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(o.tokens, dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(o.logprobs, dtype="<f4").tobytes())  # the bits, as check_invariance compares
    h.update(o.finish_reason.encode())
    return np.frombuffer(h.digest(), dtype=np.uint8)


def _layout_output(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role, layout: str,
                   index: int, run: int = 1) -> Output:
    for c in plan.layout_calls(package, layout, run):
        if index in c.units:
            return found[c.key].outputs[c.units.index(index)]
    raise AssertionError("a plan's calls of one layout cover every unit")


def _output_difference(a: Output, b: Output) -> str | None:
    n = min(len(a.tokens), len(b.tokens))
    mismatch = np.flatnonzero(a.tokens[:n] != b.tokens[:n])
    if mismatch.size:
        return f"tokens differ at position {int(mismatch[0])}"
    if len(a.tokens) != len(b.tokens):
        return f"responses have {len(a.tokens)} and {len(b.tokens)} tokens"
    bits = np.flatnonzero(a.logprobs.view(np.uint32) != b.logprobs.view(np.uint32))
    if bits.size:
        p = int(bits[0])
        return (f"log-probabilities differ at position {p} (bits {int(a.logprobs.view(np.uint32)[p]):08x} vs "
                f"{int(b.logprobs.view(np.uint32)[p]):08x})")
    if a.finish_reason != b.finish_reason:
        return f"finish reasons differ ({a.finish_reason} vs {b.finish_reason})"
    return None


def task_losses(
    units: Sequence[Unit], outputs: Sequence[Output], vocabulary: ModelTokenizer, scorer: Scorer
) -> np.ndarray:
    """Task loss per unit, recomputed from the response tokens by the contract's scorer: int64[n], each 0 or 1, for
    a binary scorer; float64[n], each in the scorer's declared range, for any other."""
    return token_losses(units, [o.tokens for o in outputs], vocabulary, scorer)


def token_losses(
    units: Sequence[Unit], responses: Sequence[np.ndarray], vocabulary: ModelTokenizer, scorer: Scorer
) -> np.ndarray:
    """`task_losses` of the responses' tokens (int[T] each), one per unit."""
    if not scorer.binary:
        return np.array([unit_range_loss(u, t, vocabulary, scorer) for u, t in zip(units, responses, strict=True)],
                        dtype=np.float64)
    return np.array([unit_loss(u, t, vocabulary, scorer) for u, t in zip(units, responses, strict=True)],
                    dtype=np.int64)


def unit_loss(unit: Unit, tokens: np.ndarray, vocabulary: ModelTokenizer, scorer: Scorer) -> int:
    """One unit's task loss: the response text decoded by the core from `tokens` (int[T]), scored by `scorer`."""
    loss = scorer.loss(unit.scored(), vocabulary.decode(tokens.tolist()))
    if loss not in (0, 1):  # a binary scorer's losses are 0/1; a user function may still break its word
        raise EvidenceError(f"unit {unit.unit_id}: the scorer gave loss {loss!r}, not 0 or 1")
    return int(loss)


def unit_range_loss(unit: Unit, tokens: np.ndarray, vocabulary: ModelTokenizer, scorer: Scorer) -> float:
    """One unit's task loss under a scorer whose losses lie in a declared [a, b] (not 0/1), as `unit_loss`."""
    loss = scorer.loss(unit.scored(), vocabulary.decode(tokens.tolist()))
    low, high = scorer.loss_range
    if not (math.isfinite(loss) and low <= loss <= high):  # scorers refuse this already; the bound relies on it
        raise EvidenceError(f"unit {unit.unit_id}: the scorer gave loss {loss!r}, outside its declared loss_range "
                            f"[{low:g}, {high:g}]")
    return float(loss)


def layout_losses(
    plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role, layout: str,
    vocabulary: ModelTokenizer, scorer: Scorer,
) -> np.ndarray:
    """Each planned unit's task loss under `package`'s `layout` calls: int64[n] for a binary scorer, float64[n]
    for any other (0 for a look a sequential run did not reach)."""
    losses = np.zeros(len(plan.units), dtype=np.int64 if scorer.binary else np.float64)
    for c in plan.layout_calls(package, layout):
        if plan.sequential is not None and c.key not in found:
            continue  # a look the run did not reach (recorded_looks checked the prefix)
        evidence = found[c.key]
        try:
            part = task_losses([plan.units[i] for i in c.units], evidence.outputs, vocabulary, scorer)
        except EvidenceError as exc:
            raise EvidenceError(f"{evidence.name}: {exc}") from None
        losses[list(c.units)] = part
    return losses


def unit_evidence(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role,
                  layout: str) -> list[CallEvidence | None]:
    """For each planned unit, the recorded call of `package` under `layout` that answered it (None where the run
    did not reach it: a sequential run's later looks)."""
    records: list[CallEvidence | None] = [None] * len(plan.units)
    for c in plan.layout_calls(package, layout):
        if c.key in found:
            for index in c.units:
                records[index] = found[c.key]
    return records


@dataclass(frozen=True)
class PremiseCheck:
    """One premise as the decision relied on it."""

    statement: str
    party: str
    basis_sha256: str
    reliance: str
    holds: bool
    note: str

    def output(self) -> PremiseOutput:
        """What a decision prints of it."""
        return PremiseOutput(statement=self.statement, party=self.party, basis_sha256=self.basis_sha256,
                             reliance=self.reliance, holds=self.holds, note=self.note)


def check_premises(contract: Contract, contract_dir: Path) -> tuple[PremiseCheck, ...]:
    """Each premise with whether it has its declared reliance: vouched ones by the party's word, checked ones
    by re-hashing their basis file now."""
    checks: list[PremiseCheck] = []
    for p in contract.premises:
        if p.reliance == "vouched":
            holds, note = True, "relies on the party's word; the core cannot check the basis"
        else:
            assert p.basis_path is not None
            path = contract_dir / p.basis_path
            if not path.is_file():
                holds, note = False, f"basis file {path} is missing"
            else:
                actual = canonical.file_sha256(path)
                holds = actual == p.basis_sha256
                note = f"basis file {path} re-hashed: " + ("matches" if holds else f"sha256 is now {actual}")
        checks.append(PremiseCheck(p.statement, p.party, p.basis_sha256, p.reliance, holds, note))
    return tuple(checks)


def conservative_delta(delta: Decimal) -> float:
    """δ as the largest float not above it: rounding must never grant more error probability than declared."""
    x = float(delta)
    return math.nextafter(x, 0.0) if Fraction(x) > Fraction(delta) else x


@dataclass(frozen=True)
class Decision:
    """An answer with every number, the method and every premise it rests on."""

    answer: Answer
    reason: str
    contract_name: str
    contract_sha256: str
    run: str
    standard: str
    epsilon: Decimal
    """ε as the contract writes it."""
    delta: Decimal | None
    """δ as the contract writes it (population standard only)."""
    invariance: Invariance
    premises: tuple[PremiseCheck, ...]
    task_loss: TaskLoss | RangeTaskLoss
    """0/1 losses (`TaskLoss`), or losses in the scorer's declared range (`RangeTaskLoss`)."""
    bound: Bound | None
    diagnostics: PairedDiagnostics | RangeDiagnostics | None
    """Population standard only: a finite-domain decision makes no inference beyond its units."""
    evidence: tuple[CallEvidence, ...]
    plan_version: str
    chain_head: str
    """The run's head when it was decided: the anchor a receipt keeps."""
    records: int
    """How many records the run holds (its closing record included)."""
    decision_version: str = DECISION_VERSION
    measurements: NumericalComparison | None = None
    """Plan /3: the measured units compared (teacher forcing, captures); beside the decision, never deciding it
    unless the contract sets `max_kl`."""
    measurement_evidence: tuple[MeasurementRecord, ...] = ()
    kl: KlRequirement | None = None
    """The contract's `max_kl` requirement, checked at every capture (only when it sets one)."""
    sequential: SequentialDecision | None = None
    """Plan /4: where the stopping rule stopped (recomputed from the records), every look it evaluated."""
    nonfinite: NonFiniteCall | None = None
    """The candidate's first generate call answered with non-finite values, when the run stopped at one: it decides
    Violated by itself, and the task loss covers only the units both packages answered before it."""
    determinism: DeterminismOutput | None = None
    """The determinism requirement as checked (only when the contract requires it and the run reached it)."""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.answer]

    def output(self) -> DecisionOutput:
        """What `use admit --json` prints of it (less the receipt's path); the parts a decision does not have
        (measurements, sequential, nonfinite, determinism) are left unset, so they stay absent."""
        optional: dict[str, Any] = {}
        if self.measurements is not None:
            optional["measurements"] = DecisionMeasurements(
                **dict(self.measurements.body()), requirement=None if self.kl is None else self.kl.output(),
                note="measurements only; they decide nothing unless the contract sets max_kl")
        if self.sequential is not None:
            optional["sequential"] = self.sequential.output()
        if self.nonfinite is not None:
            optional["nonfinite"] = self.nonfinite.output()
        if self.determinism is not None:
            optional["determinism"] = self.determinism
        return DecisionOutput(
            answer=self.answer.value, exit_code=self.exit_code, reason=self.reason,
            decision_version=self.decision_version, plan_version=self.plan_version,
            contract=DecisionContract(name=self.contract_name, sha256=self.contract_sha256), run=self.run,
            chain_head=self.chain_head, records=self.records, standard=self.standard, epsilon=str(self.epsilon),
            delta=None if self.delta is None else str(self.delta), invariance=self.invariance.output(),
            premises=[p.output() for p in self.premises], task_loss=self.task_loss.output(),
            bound=None if self.bound is None else self.bound.output(),
            diagnostics=None if self.diagnostics is None else self.diagnostics.output(),
            evidence=[e.output() for e in self.evidence] + [m.output() for m in self.measurement_evidence],
            **optional)


def decide(
    contract: Contract, invariance: Invariance, premises: Sequence[PremiseCheck], loss: TaskLoss | RangeTaskLoss,
    task_bound: Bound | None, kl: KlRequirement | None = None, sequential: SequentialDecision | None = None,
    nonfinite: NonFiniteCall | None = None, determinism: DeterminismOutput | None = None,
) -> tuple[Answer, str]:
    """The answer and its one-line reason, in the contract's order: a candidate call answered with non-finite values
    (the package computed NaN: no other figure is needed, nor complete), invariance, determinism (when the contract
    requires it), the measurements' `max_kl` (when the contract sets one), premises, task loss (a sequential
    contract's: the stopping rule's answer). Pure."""
    if nonfinite is not None:
        return Answer.VIOLATED, (f"the candidate package produced non-finite values in candidate call {nonfinite.key} "
                                 f"(call id {nonfinite.call_id}, record {nonfinite.record_seq}; {nonfinite.units} "
                                 f"units from {nonfinite.first_unit}): {nonfinite.message.split(';')[0]}; the run "
                                 "stopped there and this recorded error decides it")
    eps_text = contract.requirement.epsilon
    if invariance.required and not invariance.holds and invariance.relative is not None:
        return Answer.VIOLATED, (f"invariance relative to the reference: {invariance.units_differing} of "
                                 f"{invariance.units} units gained layout dependence across layouts "
                                 f"{', '.join(invariance.layouts)} ({invariance.relative.reference_units_differing} "
                                 f"vary under the reference too and are not covered); {invariance.first_difference}")
    if invariance.required and not invariance.holds:
        return Answer.VIOLATED, (f"invariance: {invariance.units_differing} of {invariance.units} units differ "
                                 f"across layouts {', '.join(invariance.layouts)}; {invariance.first_difference}")
    if determinism is not None and not determinism.holds:
        excluded = "" if determinism.reference_units_differing is None else \
            (f" ({determinism.reference_units_differing} differ between the reference's runs too and are not "
             "counted)")
        return Answer.VIOLATED, (f"determinism: {determinism.units_differing} of {determinism.units} units differ "
                                 f"between {determinism.runs} runs of layout {determinism.layout} under the "
                                 f"candidate{excluded}; {determinism.first_difference}")
    if kl is not None and kl.violated:
        return Answer.VIOLATED, (f"measurements: {kl.worst} exceeds max_kl = {kl.max_kl} nats by more than its "
                                 "numerical error bound")
    if kl is not None and not kl.holds:
        return Answer.UNKNOWN, (f"measurements: {kl.worst} is within its numerical error bound of max_kl = "
                                f"{kl.max_kl} nats; the captures' precision cannot decide it")
    missing = [p for p in premises if not p.holds]
    if missing:
        return Answer.UNKNOWN, f"premise not held as declared ({missing[0].reliance}): {missing[0].note}"
    if sequential is not None:
        looks = len(sequential.looks)
        return Answer(sequential.answer), (f"{sequential.reason}; stopped at look {looks} with {sequential.stop} of "
                                           f"n_max = {sequential.n_max} units")
    if contract.requirement.standard == "finite-domain":
        mean = loss.mean_difference
        verdict = Answer.ADMITTED if within_epsilon(mean, contract.requirement.epsilon) else Answer.VIOLATED
        relation = "≤" if verdict is Answer.ADMITTED else ">"
        # Float losses make long fractions: the exact one is in task_loss.mean_difference, compared exactly.
        shown = f"{float(mean):.6g} (compared exactly)" if isinstance(loss, RangeTaskLoss) else \
            f"{mean} = {float(mean):.6g}"
        return verdict, (f"finite domain: mean loss increase over exactly the {loss.n} declared units is {shown} "
                         f"{relation} ε = {eps_text}; no claim beyond these units")
    assert task_bound is not None
    assert contract.requirement.delta is not None
    return bound_answer(task_bound, eps_text, contract.requirement.delta)


def bound_answer(task_bound: Bound, epsilon: Decimal, delta: Decimal) -> tuple[Answer, str]:
    """The population standard's answer from a fixed-n bound at confidence 1 − `delta`: bounds that cross never
    decide; upper ≤ ε Admitted; lower > ε Violated; otherwise Unknown. Recorded and imported decisions share it."""
    conf = 1 - delta
    if task_bound.lower > task_bound.upper:
        # Two one-sided bounds that stop at different times can cross (probability ≤ 2δ, betting only); an empty
        # interval would let the order of the tests below pick the answer, so it never decides.
        return Answer.UNKNOWN, (f"the one-sided bounds cross: lower {task_bound.lower:.6g} > upper "
                                f"{task_bound.upper:.6g} ({task_bound.method} {task_bound.version}); "
                                "this evidence does not decide")
    if within_epsilon(Fraction(task_bound.upper), epsilon):
        return Answer.ADMITTED, (f"upper bound {task_bound.upper:.6g} on the mean loss increase ≤ ε = {epsilon} "
                                 f"at confidence {conf} ({task_bound.method} {task_bound.version})")
    if Fraction(task_bound.lower) > Fraction(epsilon):
        return Answer.VIOLATED, (f"lower bound {task_bound.lower:.6g} on the mean loss increase > ε = {epsilon} "
                                 f"at confidence {conf} ({task_bound.method} {task_bound.version})")
    return Answer.UNKNOWN, (f"the bound [{task_bound.lower:.6g}, {task_bound.upper:.6g}] contains ε = {epsilon}: "
                            "this evidence does not decide; more units may")


def range_bound(method: str, d: np.ndarray, low: float, high: float, delta: float) -> Bound:
    """The contract's bounded-range method on differences in [low, high] (losses in a declared range)."""
    try:
        return method_bound(range_method(method), d.astype(np.float64), low, high, delta)
    except StatisticsError as exc:
        raise EvidenceError(f"requirement.method {method}: {exc}") from None


def sequential_rule(contract: Contract, plan: ExecutionPlan, d: np.ndarray,
                    d_range: tuple[float, float] = (-1.0, 1.0)) -> SequentialDecision:
    """Plan /4: the stopping rule on the differences of the first looks (`d` in the rule's unit order, each in
    `d_range`: [-1, 1] for 0/1 losses, `difference_range` of the scorer otherwise): the method and looks the plan
    fixes, ε exactly, δ rounded down. "Running" when it has not stopped on these units."""
    section = plan.sequential
    req = contract.requirement
    assert section is not None
    assert req.delta is not None
    low, high = d_range
    return sequential_decision(section.method, np.asarray(d, dtype=np.float64), section.boundaries, req.epsilon,
                               conservative_delta(req.delta), section.n_max, a=low, b=high)


def sequential_stop(contract: Contract, plan: ExecutionPlan, d: np.ndarray, where: str,
                    d_range: tuple[float, float] = (-1.0, 1.0)) -> SequentialDecision:
    """Plan /4: the stopping rule on the differences of the looks recorded (`d` in the rule's unit order), which must
    stop exactly where the records end; `EvidenceError` (one line) for a run that stopped where the rule does not
    stop, or went on after it stopped."""
    if not len(d):
        raise EvidenceError(f"{where}: the run holds no complete look, where the stopping rule does not stop; resume "
                            "it with `invar use run CONTRACT --run RUN`")
    decision = sequential_rule(contract, plan, d, d_range)
    try:
        check_stop(len(d), decision)
    except StatisticsError as exc:
        raise EvidenceError(f"{where}: {exc}") from None
    return decision


__all__ = [
    "DECISION_VERSION",
    "EXIT_CODES",
    "Answer",
    "Decision",
    "Invariance",
    "PremiseCheck",
    "RelativeInvariance",
    "check_determinism",
    "check_invariance",
    "check_premises",
    "conservative_delta",
    "decide",
    "layout_invariance",
    "layout_losses",
    "output_digest",
    "range_bound",
    "relative_invariance",
    "sequential_rule",
    "sequential_stop",
    "task_losses",
    "token_losses",
    "unit_evidence",
    "unit_loss",
    "unit_range_loss",
]
