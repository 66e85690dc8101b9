"""`use admit`: decide, from a run's records and the owner's contract, whether the candidate is admitted.

The procedure, read top to bottom in `admit`: read the contract and check it names this Invar's method version;
read the run under its contract in one pass over the store, each record verified, decoded, bound and scored once
(`invar.contract.reading.RunReader`, which `use run` and `compare numerical RUN` read it with too): the owner's
inputs and the plan derived from them, every record bound to its planned call, the losses, the stopping rule and the
measurements recomputed from the bound evidence; and decide (`invar.contract.decide`, pure, where the order of the
decision is stated). Every number the decision rests on is recomputed by the core from the records, never read from
a worker.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

from invar.compare.measured import MeasurementRecord, kl_requirement
from invar.compare.numerical import NumericalComparison
from invar.contract.bind import CallEvidence, NonFiniteCall, check_stop_record
from invar.contract.decide import (
    Decision,
    Invariance,
    check_determinism,
    check_premises,
    conservative_delta,
    decide,
    layout_invariance,
    range_bound,
    relative_invariance,
    unit_evidence,
)
from invar.contract.inputs import check_method_version
from invar.contract.model import Contract, read_contract
from invar.contract.outputs import DeterminismOutput
from invar.contract.prepare import difference_range
from invar.contract.reading import RunReader
from invar.errors import InvarError
from invar.evidence import (
    Candidate,
    RangeTaskLoss,
    Reference,
    TaskLoss,
    bound_losses,
    bound_range_losses,
    paired_loss,
    paired_range_loss,
)
from invar.records.store import RunStore
from invar.stats.bounds import Bound, bound
from invar.stats.diagnostics import PairedDiagnostics, RangeDiagnostics, paired_diagnostics, range_diagnostics
from invar.stats.sequential import SequentialDecision
from invar.tasks.scorers import Scorer


@dataclass(frozen=True)
class Step:
    """What admission is doing, for a command to show: a phase and, for the one that counts (verifying the
    records), the calls done of `total`."""

    phase: str
    done: int | None = None
    total: int | None = None


def admit(
    contract_path: str | os.PathLike[str], run_path: str | os.PathLike[str], *, expect_head: str | None = None,
    progress: Callable[[Step], object] = lambda step: None,
) -> Decision:
    """Decide admission of the run at `run_path` under the owner's contract file at `contract_path`.

    With `expect_head`, the run's head must be that anchor (kept from when the run closed, or from a receipt).
    `progress` is told each phase as it starts (reading the contract's inputs; verifying the records, call by call,
    each bound and its outputs scored as it is read; scoring the losses; comparing the measurements; deciding); it
    decides nothing.
    Raises `ContractError` for a bad contract, `RecordError` for a damaged store, `EvidenceError` (naming the
    record) for evidence the contract does not accept.
    """
    contract_file = Path(contract_path)
    contract, sha = read_contract(contract_file)
    check_method_version(contract, "decide with the Invar version the contract names, or prepare a new contract")
    read = _read_run(contract, sha, contract_file, run_path, expect_head, progress)
    progress(Step("deciding"))
    # The decision's losses are evidence: each unit's loss typed by its package and bound to the record it was
    # scored from (invar.evidence), so the reference's cannot stand in for the candidate's, nor 0/1 losses for
    # losses in a declared range.
    loss: TaskLoss | RangeTaskLoss
    d: np.ndarray
    scorer = read.scorer
    if scorer.binary:
        reference = bound_losses(Reference, read.ref_evidence, read.ref_loss)
        candidate = bound_losses(Candidate, read.cand_evidence, read.cand_loss)
        d = candidate.values - reference.values
        loss = paired_loss(reference, candidate)
    else:
        ranged_ref = bound_range_losses(Reference, read.ref_evidence, read.ref_loss, scorer.loss_range)
        ranged_cand = bound_range_losses(Candidate, read.cand_evidence, read.cand_loss, scorer.loss_range)
        d = ranged_cand.values - ranged_ref.values
        loss = paired_range_loss(ranged_ref, ranged_cand)
    premises = check_premises(contract, read.base)

    req = contract.requirement
    task_bound: Bound | None = None
    diag: PairedDiagnostics | RangeDiagnostics | None = None
    delta: Decimal | None = None
    stopped = read.stopped
    if req.standard == "population" and read.nonfinite is not None:
        delta = req.delta  # the call decides; no bound is computed on the units paired before it
    elif req.standard == "population":
        assert req.method is not None
        assert req.delta is not None
        delta = req.delta
        d_low, d_high = difference_range(scorer)
        if stopped is not None:
            final = stopped.final
            task_bound = Bound(stopped.method, stopped.version, final.n, stopped.delta, float(np.mean(d)),
                               final.lower, final.upper)
        elif scorer.binary:
            task_bound = bound(req.method, d.astype(np.float64), -1.0, 1.0, conservative_delta(delta))
        else:
            task_bound = range_bound(req.method, d, d_low, d_high, conservative_delta(delta))
        if scorer.binary:
            diag = paired_diagnostics(loss.worse, loss.better, loss.n, conservative_delta(delta))
        else:
            diag = range_diagnostics(d, d_low, d_high, conservative_delta(delta))
    max_kl = None if contract.measurements is None else contract.measurements.max_kl
    kl = None if max_kl is None or read.measured is None else kl_requirement(read.measured, max_kl)
    answer, reason = decide(contract, read.invariance, premises, loss, task_bound, kl, stopped, read.nonfinite,
                            read.determinism)
    return Decision(
        answer=answer, reason=reason, contract_name=contract.name, contract_sha256=sha, run=str(run_path),
        standard=req.standard, epsilon=req.epsilon, delta=delta, invariance=read.invariance,
        premises=premises, task_loss=loss, bound=task_bound, diagnostics=diag,
        evidence=read.evidence, plan_version=read.plan_version, chain_head=read.head, records=read.records,
        measurements=read.measured, measurement_evidence=read.measurement_evidence, kl=kl, sequential=stopped,
        nonfinite=read.nonfinite, determinism=read.determinism,
    )


@dataclass(frozen=True)
class _Read:
    """What the decision takes from a run read under its contract: per unit only the losses and the record each
    was scored from. The plan, its units and the population stay inside `_read_run`, so they are released before
    the decision computes (and imports what its bounds need): what admission holds while deciding does not grow
    with the population's text."""

    head: str
    records: int
    plan_version: str
    evidence: tuple[CallEvidence, ...]
    measurement_evidence: tuple[MeasurementRecord, ...]
    measured: NumericalComparison | None
    ref_evidence: list[CallEvidence | None]
    cand_evidence: list[CallEvidence | None]
    ref_loss: np.ndarray
    cand_loss: np.ndarray
    stopped: SequentialDecision | None
    invariance: Invariance
    scorer: Scorer
    base: Path
    nonfinite: NonFiniteCall | None = None
    """The candidate's first call answered with non-finite values (the run stopped there)."""
    determinism: DeterminismOutput | None = None
    """The determinism requirement as checked (a contract that requires it, on a run not stopped by non-finite
    values)."""


def _read_run(contract: Contract, sha: str, contract_file: Path, run_path: str | os.PathLike[str],
              expect_head: str | None, progress: Callable[[Step], object]) -> _Read:
    """Verify the store and read the run under its contract: the records bound to their planned calls, the losses
    scored, the sequential stop and the invariance layouts checked."""
    with RunStore.open(run_path) as store, tempfile.TemporaryDirectory(prefix="invar-admit-") as scratch:
        progress(Step("reading the contract's inputs"))
        stream = store.stream(kept=True)
        try:
            # The run's leading records (its kept inputs, a copy of the population, among them) are verified and
            # dropped before the plan is derived: the plan is not held beside their decoding.
            stream.prime()
            reader = RunReader.of_run(contract, sha, contract_file.parent, store, Path(scratch))
        except InvarError:
            store.verify(expect_head=expect_head)  # a damaged store is named first, as when it was verified first
            raise
        plan = reader.plan
        inv_layouts = tuple(contract.invariance.layouts)
        # One pass: each record verified, decoded, bound and its outputs scored (then dropped) as it is read.
        scored = reader.read_scored(store, inv_layouts if contract.invariance.required else (),
                                    lambda done, total: progress(Step("verifying the records", done, total)),
                                    expect_head, stream, scoring=lambda: progress(Step("scoring the losses")))
        verification = scored.verification
        bound_evidence = scored.bound
        found = bound_evidence.found
        pairing = contract.pairing.layout
        scorer = reader.scorer
        losses = scored.losses
        ref_loss, cand_loss = losses["reference"], losses["candidate"]
        if plan.measurements:
            progress(Step("comparing the measurements"))
        nonfinite = bound_evidence.nonfinite[0] if bound_evidence.nonfinite else None
        measured = reader.measurements(store, bound_evidence, losses) \
            if plan.measurements and nonfinite is None else None
        stopped = None
        used: list[int] = []
        if nonfinite is not None:
            # The run stopped at a non-finite candidate call: the losses are of the units both packages answered
            # before it, beside the decision; no stop, measurement or layout is read from calls never made.
            paired = [unit_evidence(plan, found, role, pairing) for role in ("reference", "candidate")]
            used = [i for i in range(len(plan.units)) if paired[0][i] is not None and paired[1][i] is not None]
            ref_loss, cand_loss = ref_loss[used], cand_loss[used]
        elif plan.sequential is not None:
            used = reader.reached_units(found, str(store.path))
            ref_loss, cand_loss = ref_loss[used], cand_loss[used]
            stopped = reader.stop(cand_loss - ref_loss, str(store.path))
            check_stop_record(store, stopped, plan, found)
        invariance: Invariance
        if nonfinite is not None:
            invariance = Invariance(contract.invariance.required, inv_layouts, not contract.invariance.required, 0, 0,
                                    "not checked: the run stopped at a candidate call answered with non-finite "
                                    "values" if contract.invariance.required else None)
        elif contract.invariance.relative_to == "reference":
            # The reference's invariance outputs are read again from the store (the candidate's were digested
            # as they were bound).
            invariance = relative_invariance(plan, found, inv_layouts, {"candidate": scored.digests})
        else:
            differing, first = layout_invariance(plan, found, "candidate", inv_layouts, scored.digests) \
                if contract.invariance.required else (0, None)
            invariance = Invariance(contract.invariance.required, inv_layouts, differing == 0, len(plan.units),
                                    differing, first)
        determinism = None
        required = contract.determinism
        if required is not None and required.required and nonfinite is None:
            assert required.layout is not None
            # Each run's outputs are read again from the store, one call at a time.
            determinism = check_determinism(plan, found, required.layout, required.runs,
                                            required.relative_to == "reference")
    ref_evidence = unit_evidence(plan, found, "reference", pairing)
    cand_evidence = unit_evidence(plan, found, "candidate", pairing)
    if stopped is not None or nonfinite is not None:  # the units reached; otherwise every planned unit, as planned
        ref_evidence, cand_evidence = [ref_evidence[i] for i in used], [cand_evidence[i] for i in used]
    return _Read(
        head=verification.head, records=verification.records, plan_version=plan.version,
        evidence=tuple(found[c.key] for c in plan.calls if c.key in found),
        # A run closed at a non-finite candidate call holds the measurement calls made before it, not the plan's all.
        measurement_evidence=tuple(bound_evidence.measured[m.key] for m in plan.measurements
                                   if nonfinite is None or m.key in bound_evidence.measured), measured=measured,
        ref_evidence=ref_evidence, cand_evidence=cand_evidence, ref_loss=ref_loss, cand_loss=cand_loss,
        stopped=stopped,
        invariance=invariance,
        scorer=scorer, base=reader.base, nonfinite=nonfinite, determinism=determinism)


__all__ = [
    "Step",
    "admit",
]
