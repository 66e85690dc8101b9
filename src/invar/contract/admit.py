"""`use admit`: decide, from a run's records and the owner's contract, whether the candidate is admitted.

The anchors come from outside the evidence: the contract file the owner holds fixes the packages, the population,
every planned call and its seeds; the run only supplies records. Admission re-verifies every record, attributes
each generate call to a package by its worker identity and the model its worker loaded, demands that every call
of the plan is present exactly once with exactly the contract's parameters, and refuses anything else by naming
the record. It then recomputes every score from the response tokens with its own detokenizer, never reading a
number a worker computed when the core can compute it.

The decision, in order:
1. Invariance (if the contract requires it): the candidate's runs under the declared layouts give bit-identical
   tokens and log-probabilities for every unit. Any difference is a definite breach: Violated.
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

import collections
import enum
import functools
import hashlib
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.compare.measured import KlRequirement, MeasuredItem, MeasurementRecord, kl_requirement, measured_comparison
from invar.compare.numerical import DEFAULT_LARGE_STEP, InputError, NumericalComparison, Response
from invar.compare.runs import check_score_output
from invar.contract.model import Contract, Package, read_contract
from invar.contract.plan import ExecutionPlan, MeasurementCall, PlannedCall, Role, Unit, derive_plan, measurement_params
from invar.contract.prepare import (
    ROLES,
    contract_scorer,
    difference_range,
    method_version,
    model_folders,
    package_tokenizers,
    prompt_encoders,
)
from invar.errors import ContractError, EvidenceError
from invar.evidence import (
    Candidate,
    RangeTaskLoss,
    Reference,
    TaskLoss,
    bound_losses,
    bound_range_losses,
    check_patches_active,
    paired_loss,
    paired_range_loss,
    paired_task_loss,
    range_method,
    within_epsilon,
)
from invar.evidence import task_bound as method_bound
from invar.records.store import CallRecord, RunStore
from invar.stats.bounds import Bound, StatisticsError, bound
from invar.stats.diagnostics import PairedDiagnostics, RangeDiagnostics, paired_diagnostics, range_diagnostics
from invar.stats.sequential import SequentialDecision, check_stop, sequential_decision
from invar.tasks.population import load_units
from invar.tasks.scorers import Scorer
from invar.tasks.tokenizer import BASE_FILES, ModelTokenizer, from_kept, kept_files

DECISION_VERSION = "invar.admit/1"
"""Names the decision procedure above; the bound method and its version are reported beside it."""


class Answer(enum.StrEnum):
    """The three answers of a use decision."""

    ADMITTED = "Admitted"
    VIOLATED = "Violated"
    UNKNOWN = "Unknown"


EXIT_CODES: Mapping[Answer, int] = {Answer.ADMITTED: 0, Answer.VIOLATED: 10, Answer.UNKNOWN: 11}
"""Exit status of `invar use admit` per answer; refused evidence or bad input exits 2 (`InvarError`)."""


# --- evidence ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One request's output as the core reads it from a report."""

    request_id: str
    tokens: np.ndarray
    """int32[T], end-of-sequence token included when `finish_reason` is `stop`."""
    logprobs: np.ndarray
    """float32[T], natural log, at the request's temperature."""
    finish_reason: str


@dataclass(frozen=True)
class CallEvidence:
    """A planned call and the record that answered it."""

    key: str
    package: Role
    layout: str
    record_seq: int
    call_id: int
    call_digest: str
    report_digest: str
    kept: tuple[Output, ...] | None = None
    """The outputs as bound, when binding kept them; None when they are read again from the store when asked."""
    reread: Callable[[], tuple[Output, ...]] | None = field(default=None, compare=False, repr=False)

    @property
    def outputs(self) -> tuple[Output, ...]:
        """The report's outputs, checked against the planned requests (read again from the store, which must still
        be open, when binding did not keep them)."""
        if self.kept is not None:
            return self.kept
        assert self.reread is not None
        return self.reread()

    @property
    def name(self) -> str:
        """How messages name the record, as the store does."""
        return f"record {self.record_seq} (call {self.call_id}, generate, {self.call_digest[:12]}…)"

    def to_json(self) -> dict[str, Any]:
        return {
            "call": self.key,
            "record": self.record_seq,
            "call_id": self.call_id,
            "call_digest": self.call_digest,
            "report_digest": self.report_digest,
        }


def _first_difference(expected: Any, actual: Any, where: str) -> str | None:
    """The first place two decoded values differ (types included), as `where: what`; None if equal."""
    if isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):
        if not isinstance(expected, np.ndarray) or not isinstance(actual, np.ndarray):
            return f"{where} is {canonical.show(actual)} in the record, {canonical.show(expected)} in the contract"
        if expected.dtype != actual.dtype or expected.shape != actual.shape or \
                expected.tobytes() != actual.tobytes():
            return (f"{where} is a {actual.dtype} array of shape {actual.shape} in the record, not the "
                    f"{expected.dtype} array of shape {expected.shape} the plan and the recorded responses give")
        return None
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                return f"{where}.{key} is missing (the contract has {expected[key]!r})"
            if key not in expected:
                return f"{where}.{key} is not in the contract"
            found = _first_difference(expected[key], actual[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            found = _first_difference(e, a, f"{where}[{i}]")
            if found:
                return found
        if len(expected) != len(actual):
            return f"{where} has {len(actual)} entries, the contract's has {len(expected)}"
        return None
    if type(expected) is not type(actual) or expected != actual:
        return f"{where} is {actual!r} in the record, {expected!r} in the contract"
    return None


def _anchor_of(rec: CallRecord, load: CallRecord) -> dict[str, Any]:
    """The package anchor a generate record was made under: its worker's identity and last model load."""
    ident = rec.identity
    params = load.call.params
    adapter = params.get("adapter")
    return {
        "engine": ident.engine,
        "engine_version": dict(ident.engine_version),
        "settings": ident.settings,
        "model_digest": params.get("model_digest"),
        "dtype": params.get("dtype"),
        "quantization": params.get("quantization"),
        "adapter_digest": adapter.get("digest") if isinstance(adapter, dict) else None,
        # The code that answered, as the worker reported it (absent in records made before worker code was pinned).
        "worker_digest": (ident.worker or {}).get("digest"),
    }


def _attribute(rec: CallRecord, load: CallRecord | None, contract: Contract) -> Role:
    """Which package made a generate record; `EvidenceError` naming the record if neither did."""
    if rec.identity.role.value != "inference":
        raise EvidenceError(f"{rec.name}: made by a {rec.identity.role.value} worker; generate needs inference")
    if load is None:
        raise EvidenceError(f"{rec.name}: its worker loaded no model before it (no successful load_model record)")
    anchor = _anchor_of(rec, load)
    roles: tuple[Role, Role] = ("reference", "candidate")
    for role in roles:
        if anchor == contract.package(role).anchor():
            return role
    # Name the difference from the package it is closest to, so the owner sees what is foreign.
    def distance(role: Role) -> int:
        expected = contract.package(role).anchor()
        return sum(expected[k] != anchor[k] for k in expected)

    closest = min(roles, key=distance)
    expected = contract.package(closest).anchor()
    if anchor["worker_digest"] is None and expected["worker_digest"] is not None:
        raise EvidenceError(f"{rec.name}: its worker's identity names no worker code digest (a run made before "
                            f"worker code was pinned), the {closest}'s names {expected['worker_digest']}; run the "
                            "contract again")
    diff = _first_difference(expected, anchor, "package")
    raise EvidenceError(f"{rec.name}: made by a package that is neither reference nor candidate; "
                        f"against the {closest}: {diff}")


def _result(rec: CallRecord) -> dict[str, Any]:
    """The result of a record answered ok (callers check that first)."""
    assert rec.report is not None
    assert rec.report.report.result is not None
    return rec.report.report.result


def _check_loaded(rec: CallRecord, load: CallRecord, package: Package, role: Role) -> None:
    """The load report and the generate report both name the package's model and adapter digests."""
    want = (package.model_digest, None if package.adapter is None else package.adapter.digest)
    for source in (load, rec):
        result = _result(source)
        got = (result.get("model_digest"), result.get("adapter_digest"))
        if got != want:
            raise EvidenceError(
                f"{source.name}: its report names model {str(got[0])[:16]}… adapter {str(got[1])[:16]}…, not the "
                f"{role}'s model {want[0][:16]}… adapter {str(want[1])[:16]}…"
            )


def parse_outputs(result: Mapping[str, Any], planned: PlannedCall, eos: frozenset[int], name: str) -> tuple[
        Output, ...]:
    """Check a generate result's outputs against its planned requests (`eos`: the ids that end a response);
    `EvidenceError` naming the record `name`."""
    requests = planned.params["requests"]
    outputs = result.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(requests):
        n = len(outputs) if isinstance(outputs, list) else "no"
        raise EvidenceError(f"{name}: the report has {n} outputs for {len(requests)} requests")
    out: list[Output] = []
    for i, (o, req) in enumerate(zip(outputs, requests, strict=True)):
        where = f"{name}: output {i}"
        if not isinstance(o, dict) or o.get("request_id") != req["request_id"]:
            got = o.get("request_id") if isinstance(o, dict) else None
            raise EvidenceError(f"{where} answers request {got!r}, expected {req['request_id']!r}")
        tokens, logprobs, finish = o.get("tokens"), o.get("logprobs"), o.get("finish_reason")
        if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32 or tokens.ndim != 1:
            raise EvidenceError(f"{where} ({req['request_id']}): tokens are not an int32 vector")
        if not isinstance(logprobs, np.ndarray) or logprobs.dtype != np.float32 or logprobs.shape != tokens.shape:
            raise EvidenceError(f"{where} ({req['request_id']}): logprobs are not a float32 vector as long as tokens")
        ran = o.get("prompt_tokens")
        if not isinstance(ran, np.ndarray) or not np.array_equal(ran, req["prompt_ids"]):
            raise EvidenceError(f"{where} ({req['request_id']}): the engine ran other prompt tokens than the call "
                                "asked for")
        t = len(tokens)
        stops = np.isin(tokens, np.fromiter(eos, dtype=np.int64))
        if finish == "stop":
            if t == 0 or not stops[-1] or stops[:-1].any():
                raise EvidenceError(f"{where} ({req['request_id']}): finish_reason stop, but the tokens do not end "
                                    "at the first end-of-sequence token")
        elif finish == "length":
            if t != req["max_tokens"] or stops.any():
                raise EvidenceError(f"{where} ({req['request_id']}): finish_reason length with {t} tokens "
                                    f"(max_tokens {req['max_tokens']}) or an end-of-sequence token inside")
        else:
            raise EvidenceError(f"{where} ({req['request_id']}): finish_reason {finish!r} is neither stop nor length")
        if t > req["max_tokens"]:
            raise EvidenceError(f"{where} ({req['request_id']}): {t} tokens exceed max_tokens {req['max_tokens']}")
        out.append(Output(req["request_id"], tokens, logprobs, finish))
    return tuple(out)


def run_contract_sha256(store: RunStore) -> str:
    """The contract a run was made under (its meta `run.contract_sha256`); `EvidenceError` if it names none."""
    meta = store.meta().get("run", {})
    run_contract = meta.get("contract_sha256") if isinstance(meta, dict) else None
    if not isinstance(run_contract, str):
        raise EvidenceError(f"{store.path}: the run names no contract (meta run.contract_sha256); "
                            "admit only runs made with use run")
    return run_contract


@dataclass
class BoundEvidence:
    """What a run's records bind to the plan: generate evidence and measurement records by plan call key, and why
    planned calls without a successful record have none (unanswered, or answered with an error)."""

    found: dict[str, CallEvidence]
    measured: dict[str, MeasurementRecord]
    failed: dict[str, str]


class _PairingIndex:
    """Where each unit's pairing-layout response of each package is: (planned call key, position in its outputs)."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.where: dict[tuple[Role, int], tuple[str, int]] = {}
        roles: tuple[Role, Role] = ("reference", "candidate")
        for role in roles:
            for c in plan.layout_calls(role, plan.pairing_layout):
                for pos, index in enumerate(c.units):
                    self.where[(role, index)] = (c.key, pos)


def _bind_measurement(rec: CallRecord, load: CallRecord | None, contract: Contract, plan: ExecutionPlan,
                      pairing: _PairingIndex, by_items: Mapping[tuple[Role, tuple[Any, ...]], MeasurementCall],
                      bound: BoundEvidence) -> None:
    """Bind one score record of a plan /3 run to its planned measurement call (see `bind_records`)."""
    role = _attribute(rec, load, contract)
    params = rec.call.params
    items = params.get("items")
    ids = tuple(it.get("item_id") if isinstance(it, dict) else None for it in items) if isinstance(items, list) \
        else ()
    planned = by_items.get((role, ids))
    if planned is None:
        raise EvidenceError(f"{rec.name}: a score call of the {role} that is no planned measurement (its items are not "
                            "the units of a measured batch of the pairing layout)")

    def tokens(index: int) -> np.ndarray:
        key, pos = pairing.where[(planned.source, index)]
        evidence = bound.found.get(key)
        if evidence is None:
            raise EvidenceError(f"{rec.name}: measures unit {plan.units[index].unit_id} before the {planned.source}'s "
                                f"response to it is on record (planned call {key})")
        return evidence.outputs[pos].tokens

    expected = measurement_params(plan, planned, tokens)
    if canonical.digest(expected) != canonical.digest(params):
        diff = _first_difference(expected, params, "params") or "params are encoded differently"
        raise EvidenceError(f"{rec.name}: does not match planned measurement call {planned.key}: {diff}")
    answered = rec.report is not None and rec.report.report.ok
    if not answered:
        reason = "was never answered" if rec.report is None else "was answered with an error"
        bound.failed.setdefault(planned.key, f"{rec.name} {reason}")
        return
    if planned.key in bound.measured:
        raise EvidenceError(f"{rec.name}: repeats planned call {planned.key}, already answered by record "
                            f"{bound.measured[planned.key].record_seq}")
    assert load is not None  # _attribute refuses a record without a load
    assert rec.report is not None
    package = contract.package(role)
    _check_loaded(rec, load, package, role)
    result = _result(rec)
    check_patches_active(result, package.patches, rec.name)
    outputs = result.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(planned.units):
        raise EvidenceError(f"{rec.name}: the report does not answer its {len(planned.units)} items")
    width = _result(load).get("vocab_size")
    scored: list[MeasuredItem] = []
    for index, item, out in zip(planned.units, params["items"], outputs, strict=True):
        got = check_score_output(item, out, rec.name)
        if got.vocab_size is not None and isinstance(width, int) and got.vocab_size != width:
            raise EvidenceError(f"{rec.name} ({plan.units[index].unit_id}): captures of {got.vocab_size} tokens from "
                                f"a model whose worker reported a vocabulary of {width}")
        scored.append(MeasuredItem(index, got.logprobs, got.steps, got.vocab_size))
    bound.measured[planned.key] = MeasurementRecord(
        key=planned.key, package=role, source=planned.source, record_seq=rec.seq, report_seq=rec.report.seq,
        call_id=rec.call.call_id, call_digest=rec.call_digest, report_digest=rec.report.report_digest,
        items=tuple(scored))


class OutputReader:
    """Reads a bound generate record's outputs again from the store, when asked, instead of binding keeping them:
    the evidence of a run then takes memory per call, not per token. The last few calls read are kept (the
    measurements of one generate call read its outputs once per item)."""

    def __init__(self, store: RunStore, keep: int = 4) -> None:
        self._store = store
        self._keep = keep
        self._recent: collections.OrderedDict[int, tuple[Output, ...]] = collections.OrderedDict()

    def read(self, seq: int, planned: PlannedCall, eos: frozenset[int], name: str) -> tuple[Output, ...]:
        if seq in self._recent:
            self._recent.move_to_end(seq)
            return self._recent[seq]
        outputs = parse_outputs(_result(self._store.call_at(seq)), planned, eos, name)
        self._recent[seq] = outputs
        if len(self._recent) > self._keep:
            self._recent.popitem(last=False)
        return outputs


def bind_records(
    records: Iterable[CallRecord], contract: Contract, plan: ExecutionPlan, eos: Mapping[Role, frozenset[int]],
    reader: OutputReader | None = None,
) -> BoundEvidence:
    """Bind each answered generate record, and under plan /3 each measurement (score) record, to the planned call
    it executes, by plan call key.

    Raises `EvidenceError`, naming the record, for a call from a foreign package, a call or parameter the plan does
    not contain, a repeated call, a report naming other files, or outputs the plan refuses. A measurement record
    must carry exactly the recorded responses the plan says it scores. A run that is still going (or was killed)
    binds as far as it got: `use run` resumes from this. Records may come in call order (`RunStore.calls`,
    `RunStore.iter_calls`) or report order (`RunStore.stream`). With a `reader`, each record's outputs are checked
    as they bind and then dropped; the evidence reads them again through it when asked.
    """
    by_params = {(c.package, c.params_digest): c for c in plan.calls}
    by_items = {(m.package, tuple(plan.units[i].unit_id for i in m.units)): m for m in plan.measurements}
    pairing = _PairingIndex(plan)
    last_load: dict[str, CallRecord] = {}
    bound = BoundEvidence({}, {}, {})
    found, failed = bound.found, bound.failed
    for rec in records:
        method = rec.call.method
        answered = rec.report is not None and rec.report.report.ok
        if method == "load_model" and answered:
            last_load[rec.worker] = rec
        if method == "score" and plan.measurements:
            _bind_measurement(rec, last_load.get(rec.worker), contract, plan, pairing, by_items, bound)
            continue
        if method != "generate":
            continue  # scoring outside a plan's measurements does not enter the decision
        role = _attribute(rec, last_load.get(rec.worker), contract)
        params = rec.call.params
        planned = by_params.get((role, canonical.digest(params)))
        if planned is None:
            nearest = _nearest_call(plan, role, params)
            diff = _first_difference(nearest.params, params, "params") or "params are encoded differently"
            raise EvidenceError(f"{rec.name}: does not match planned call {nearest.key} (nor any other): {diff}")
        if not answered:
            reason = "was never answered" if rec.report is None else "was answered with an error"
            failed.setdefault(planned.key, f"{rec.name} {reason}")
            continue
        if planned.key in found:
            raise EvidenceError(f"{rec.name}: repeats planned call {planned.key}, already answered by record "
                                f"{found[planned.key].record_seq}")
        load = last_load[rec.worker]
        package = contract.package(role)
        _check_loaded(rec, load, package, role)
        check_patches_active(_result(rec), package.patches, rec.name)
        assert rec.report is not None
        outputs = parse_outputs(_result(rec), planned, eos[role], rec.name)
        found[planned.key] = CallEvidence(
            key=planned.key, package=role, layout=planned.layout, record_seq=rec.seq, call_id=rec.call.call_id,
            call_digest=rec.call_digest, report_digest=rec.report.report_digest,
            kept=outputs if reader is None else None,
            reread=None if reader is None else functools.partial(reader.read, rec.seq, planned, eos[role], rec.name),
        )
    bound.failed = {k: v for k, v in failed.items() if k not in found and k not in bound.measured}
    return bound


def collect_evidence(
    store: RunStore, contract: Contract, sha256: str, plan: ExecutionPlan, eos: Mapping[Role, frozenset[int]]
) -> BoundEvidence:
    """Verify the store and bind every planned call to the one record that answered it, by plan call key.

    Raises `RecordError` for a store that fails verification and `EvidenceError`, naming the record, for a run
    of another contract, an incomplete run, anything `bind_records` refuses, or a planned call with no successful
    record. The evidence reads its outputs from `store` when asked: use it while the store is open.
    """
    if not store.verify().closed:  # digests, the chain and every report's binding to its call, meta included
        raise _incomplete(store)
    _check_run_contract(store, sha256)
    # Read one call at a time, outputs checked and dropped: the store stays open while the evidence is used.
    return _complete(store, plan, bind_records(store.iter_calls(), contract, plan, eos, OutputReader(store)))


def stream_evidence(
    store: RunStore, contract: Contract, sha256: str, plan: ExecutionPlan, eos: Mapping[Role, frozenset[int]]
) -> BoundEvidence:
    """As `collect_evidence`, reading the store once as a stream (`RunStore.stream`) instead of holding every record:
    the same checks, though a record the plan refuses may be named before a damaged record later in the store."""
    stream = store.stream()
    bound = bind_records(stream, contract, plan, eos)
    if stream.verification is None or not stream.verification.closed:
        raise _incomplete(store)
    _check_run_contract(store, sha256)
    return _complete(store, plan, bound)


def _incomplete(store: RunStore) -> EvidenceError:
    return EvidenceError(f"{store.path}: the run is incomplete (no closing record: it stopped before it finished, "
                         "or its tail was cut); resume it with `invar use run CONTRACT --run RUN`")


def _check_run_contract(store: RunStore, sha256: str) -> None:
    run_contract = run_contract_sha256(store)
    if run_contract != sha256:
        raise EvidenceError(f"{store.path}: the run was made under contract {str(run_contract)[:16]}…, not the "
                            f"given contract {sha256[:16]}…; give the contract the run was made for")


def recorded_looks(plan: ExecutionPlan, found: Mapping[str, CallEvidence], where: str, *,
                   running: bool = False) -> int:
    """Plan /4: how many looks the records complete. The answered calls must be exactly the calls of looks 0..K-1
    (both packages'), since the run issues look after look; anything else is refused naming the first call out of
    place. `running`: a run being resumed may also hold part of look K (it was killed during it)."""
    assert plan.sequential is not None
    looks = len(plan.sequential.boundaries)
    complete = 0
    while complete < looks and all(c.key in found for c in plan.look_calls(complete)):
        complete += 1
    for c in plan.calls:
        if c.key in found and (c.part is None or c.part >= complete + running):
            missing = next(m.key for m in plan.look_calls(complete) if m.key not in found)
            raise EvidenceError(f"{where}: planned call {c.key} (look {(c.part or 0) + 1}) is on record, but look "
                                f"{complete + 1} lacks {missing}; a sequential run completes each look before the next")
    return complete


def _complete(store: RunStore, plan: ExecutionPlan, bound: BoundEvidence) -> BoundEvidence:
    if plan.sequential is not None:
        # The stopping rule, not the plan's length, says how many looks a run holds: admit checks that.
        recorded_looks(plan, bound.found, str(store.path))
        return bound
    for c in plan.calls:
        if c.key not in bound.found:
            why = f" ({bound.failed[c.key]})" if c.key in bound.failed else ""
            raise EvidenceError(f"{store.path}: planned call {c.key} (generate, {len(c.params['requests'])} requests) "
                                f"has no successful record{why}; run the whole plan")
    for m in plan.measurements:
        if m.key not in bound.measured:
            why = f" ({bound.failed[m.key]})" if m.key in bound.failed else ""
            raise EvidenceError(f"{store.path}: planned measurement {m.key} (score, {len(m.units)} items) has no "
                                f"successful record{why}; run the whole plan")
    return bound


def _nearest_call(plan: ExecutionPlan, role: Role, params: Any) -> PlannedCall:
    """The planned call of `role` a foreign call is closest to (same first request, then same batch structure),
    so the refusal can name what differs."""
    mine = [c for c in plan.calls if c.package == role] or list(plan.calls)
    requests = params.get("requests") if isinstance(params, dict) else None
    first = requests[0].get("request_id") if isinstance(requests, list) and requests and \
        isinstance(requests[0], dict) else None
    layout = canonical.digest(params.get("layout")) if isinstance(params, dict) else None

    def score(c: PlannedCall) -> tuple[bool, bool]:
        return (c.params["requests"][0]["request_id"] == first, canonical.digest(c.batches) == layout)

    return max(mine, key=score)


def layout_outputs(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role,
                   layout: str) -> list[Output]:
    """One package's outputs under one layout, gathered from all its calls into the plan's unit order."""
    outputs: list[Output | None] = [None] * len(plan.units)
    for c in plan.layout_calls(package, layout):
        for index, output in zip(c.units, found[c.key].outputs, strict=True):
            outputs[index] = output
    assert all(o is not None for o in outputs), "a plan's calls of one layout cover every unit"
    return [o for o in outputs if o is not None]


# --- the pure parts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invariance:
    """Whether the candidate's outputs were bit-identical across the declared layouts."""

    required: bool
    layouts: tuple[str, ...]
    holds: bool
    units: int
    units_differing: int
    first_difference: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "required": self.required, "layouts": list(self.layouts), "holds": self.holds, "units": self.units,
            "units_differing": self.units_differing, "first_difference": self.first_difference,
            "covers": "only the layouts listed; the reference is not required to be invariant",
        }


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


def layout_invariance(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role,
                      layouts: Sequence[str]) -> tuple[int, str | None]:
    """`check_invariance` of one package's outputs under `layouts`, read one call at a time: each unit's output is
    kept as a digest of its tokens, log-probability bits and finish reason, and only the first differing unit's two
    outputs are read again to describe the difference. The same count and description."""
    names = list(layouts)
    digests = {name: _output_digests(plan, found, package, name) for name in names}
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


def _output_digests(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role, layout: str) -> np.ndarray:
    """uint8[units, 32]: per unit, sha256 of its output's token count, tokens, log-probability bits and finish."""
    out = np.zeros((len(plan.units), 32), dtype=np.uint8)
    for c in plan.layout_calls(package, layout):
        for index, o in zip(c.units, found[c.key].outputs, strict=True):
            h = hashlib.sha256(len(o.tokens).to_bytes(8, "little"))
            h.update(np.ascontiguousarray(o.tokens, dtype="<i4").tobytes())
            h.update(np.ascontiguousarray(o.logprobs, dtype="<f4").tobytes())  # the bits, as check_invariance compares
            h.update(o.finish_reason.encode())
            out[index] = np.frombuffer(h.digest(), dtype=np.uint8)
    return out


def _layout_output(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role, layout: str,
                   index: int) -> Output:
    for c in plan.layout_calls(package, layout):
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
    if not scorer.binary:
        return np.array([unit_range_loss(u, o.tokens, vocabulary, scorer)
                         for u, o in zip(units, outputs, strict=True)], dtype=np.float64)
    return np.array([unit_loss(u, o.tokens, vocabulary, scorer) for u, o in zip(units, outputs, strict=True)],
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

    def to_json(self) -> dict[str, Any]:
        return {"statement": self.statement, "party": self.party, "basis_sha256": self.basis_sha256,
                "reliance": self.reliance, "holds": self.holds, "note": self.note}


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

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.answer]

    def to_json(self) -> dict[str, Any]:
        b = self.bound
        return {
            "answer": self.answer.value,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "decision_version": self.decision_version,
            "plan_version": self.plan_version,
            "contract": {"name": self.contract_name, "sha256": self.contract_sha256},
            "run": self.run,
            "chain_head": self.chain_head,
            "records": self.records,
            "standard": self.standard,
            "epsilon": str(self.epsilon),
            "delta": None if self.delta is None else str(self.delta),
            "invariance": self.invariance.to_json(),
            "premises": [p.to_json() for p in self.premises],
            "task_loss": self.task_loss.to_json(),
            "bound": None if b is None else {
                "method": b.method, "version": b.version, "n": b.n, "delta": b.delta,
                "estimate": b.estimate, "lower": b.lower, "upper": b.upper,
            },
            "diagnostics": None if self.diagnostics is None else diagnostics_json(self.diagnostics),
            "evidence": [e.to_json() for e in self.evidence] + [m.to_json() for m in self.measurement_evidence],
            **({} if self.measurements is None else {"measurements": {
                **self.measurements.to_json(per_unit=False),
                "requirement": None if self.kl is None else self.kl.to_json(),
                "note": "measurements only; they decide nothing unless the contract sets max_kl"}}),
            **({} if self.sequential is None else {"sequential": sequential_json(self.sequential)}),
        }


def sequential_json(decision: SequentialDecision) -> dict[str, Any]:
    """The stopping rule's decision as JSON: which method version decided, at which look, and every look's bounds."""
    return {"method": decision.method, "version": decision.version, "answer": decision.answer,
            "look": len(decision.looks), "stop": decision.stop, "n_max": decision.n_max, "delta": decision.delta,
            "reason": decision.reason,
            "looks": [{"n": look.n, "lower": look.lower, "upper": look.upper} for look in decision.looks]}


def decide(
    contract: Contract, invariance: Invariance, premises: Sequence[PremiseCheck], loss: TaskLoss | RangeTaskLoss,
    task_bound: Bound | None, kl: KlRequirement | None = None, sequential: SequentialDecision | None = None,
) -> tuple[Answer, str]:
    """The answer and its one-line reason, in the contract's order: invariance, the measurements' `max_kl` (when
    the contract sets one), premises, task loss (a sequential contract's: the stopping rule's answer). Pure."""
    eps_text = contract.requirement.epsilon
    eps = Fraction(eps_text)
    if invariance.required and not invariance.holds:
        return Answer.VIOLATED, (f"invariance: {invariance.units_differing} of {invariance.units} units differ "
                                 f"across layouts {', '.join(invariance.layouts)}; {invariance.first_difference}")
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
    conf = 1 - contract.requirement.delta
    if task_bound.lower > task_bound.upper:
        # Two one-sided bounds that stop at different times can cross (probability ≤ 2δ, betting only); an empty
        # interval would let the order of the tests below pick the answer, so it never decides.
        return Answer.UNKNOWN, (f"the one-sided bounds cross: lower {task_bound.lower:.6g} > upper "
                                f"{task_bound.upper:.6g} ({task_bound.method} {task_bound.version}); "
                                "this evidence does not decide")
    if within_epsilon(Fraction(task_bound.upper), contract.requirement.epsilon):
        return Answer.ADMITTED, (f"upper bound {task_bound.upper:.6g} on the mean loss increase ≤ ε = {eps_text} "
                                 f"at confidence {conf} ({task_bound.method} {task_bound.version})")
    if Fraction(task_bound.lower) > eps:
        return Answer.VIOLATED, (f"lower bound {task_bound.lower:.6g} on the mean loss increase > ε = {eps_text} "
                                 f"at confidence {conf} ({task_bound.method} {task_bound.version})")
    return Answer.UNKNOWN, (f"the bound [{task_bound.lower:.6g}, {task_bound.upper:.6g}] contains ε = {eps_text}: "
                            "this evidence does not decide; more units may")


def diagnostics_json(diag: PairedDiagnostics | RangeDiagnostics) -> dict[str, Any]:
    """The diagnostics as JSON, labelled so no reader mistakes them for the decision."""
    h = diag.hoeffding
    if isinstance(diag, RangeDiagnostics):
        return {
            "paired_wald": {"confidence": diag.wald_confidence, "lower": diag.wald[0], "upper": diag.wald[1]},
            "hoeffding": {"version": h.version, "delta": h.delta, "lower": h.lower, "upper": h.upper},
            "note": "diagnostics only; the decision uses the contract's method",
        }
    return {
        "paired_wald": {"confidence": diag.wald_confidence, "lower": diag.wald[0], "upper": diag.wald[1]},
        "mcnemar_exact_one_sided": {"worse": diag.worse, "better": diag.better, "p": diag.mcnemar_p},
        "hoeffding": {"version": h.version, "delta": h.delta, "lower": h.lower, "upper": h.upper},
        "note": "diagnostics only; the decision uses the contract's method",
    }


# --- inputs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Where admission reads the files the contract fixes by digest: the population and each tokenizer folder."""

    population: Path
    tokenizers: Mapping[Role, Path]


def run_inputs(contract: Contract, base: Path) -> dict[str, Any]:
    """The files a contract fixes by digest, as bytes, for a run to keep beside its records (meta `inputs`).

    A run that carries them can be decided from a folder holding only the run and the contract: every byte is still
    checked against the contract's digests, so where the bytes come from does not matter.
    """
    population = (base / contract.population.path).read_bytes()
    folders = model_folders(contract, base)
    return {"population": population, "tokenizers": {role: kept_files(folders[role]) for role in ROLES}}


def resolve_inputs(contract: Contract, base: Path, kept: Any, scratch: Path) -> Inputs:
    """The contract's files beside the contract if they are there, else the copies the run keeps (written into
    `scratch`); the caller checks every one against the contract's digests."""
    population = base / contract.population.path
    tokenizers: dict[Role, Path] = model_folders(contract, base)
    if population.is_file() and all((tokenizers[r] / n).is_file() for r in ROLES for n in BASE_FILES):
        return Inputs(population, tokenizers)
    if not isinstance(kept, dict) or not isinstance(kept.get("population"), bytes) \
            or not isinstance(kept.get("tokenizers"), dict):
        raise ContractError(f"population: {population} or a tokenizer folder is missing beside the contract, and the "
                            "run keeps no copy of them; put the contract beside the files it names")
    population = scratch / "population.jsonl"
    population.write_bytes(kept["population"])
    for role in ROLES:
        files = kept["tokenizers"].get(role)
        folder = scratch / role
        folder.mkdir()
        if not isinstance(files, dict):
            raise EvidenceError(f"the run's kept inputs lack the {role}'s tokenizer; put the contract beside the "
                                "files it names")
        from_kept(files, folder)  # refuses a copy without the base files, before anything reads it
        tokenizers[role] = folder
    return Inputs(population, tokenizers)


# --- the whole procedure ---------------------------------------------------------------------------------------------


def read_anchors(contract: Contract, sha: str, base: Path, store: RunStore, scratch: Path) -> tuple[
        ExecutionPlan, dict[Role, ModelTokenizer]]:
    """The plan and each package's tokenizer, from the files the contract fixes by digest (beside the contract at
    `base`, or the copies the run keeps, written into `scratch`), every one checked against the contract."""
    inputs = resolve_inputs(contract, base, store.meta().get("inputs"), scratch)
    units = load_units(inputs.population, contract.population.sha256)
    tokenizers = package_tokenizers(contract, inputs.tokenizers)
    plan = derive_plan(contract, sha, units, prompt_encoders(tokenizers))
    return plan, tokenizers


def admit(
    contract_path: str | os.PathLike[str], run_path: str | os.PathLike[str], *, expect_head: str | None = None
) -> Decision:
    """Decide admission of the run at `run_path` under the owner's contract file at `contract_path`.

    With `expect_head`, the run's head must be that anchor (kept from when the run closed, or from a receipt).
    Raises `ContractError` for a bad contract, `RecordError` for a damaged store, `EvidenceError` (naming the
    record) for evidence the contract does not accept.
    """
    contract_file = Path(contract_path)
    contract, sha = read_contract(contract_file)
    method = contract.requirement.method
    if method is not None and method_version(method) != contract.method_version:
        raise ContractError(
            f"method_version: the contract fixes {contract.method_version}, this Invar computes "
            f"{method_version(method)}; decide with the Invar version the contract names, or prepare a new contract"
        )
    base = contract_file.parent
    roles: tuple[Role, Role] = ("reference", "candidate")
    with RunStore.open(run_path) as store, tempfile.TemporaryDirectory(prefix="invar-admit-") as scratch:
        verification = store.verify(expect_head=expect_head)  # walked once: collect_evidence reuses the walk
        plan, vocab = read_anchors(contract, sha, base, store, Path(scratch))
        stops = {r: frozenset(vocab[r].eos_token_ids) for r in roles}
        bound_evidence = collect_evidence(store, contract, sha, plan, stops)
        found = bound_evidence.found
        pairing = contract.pairing.layout
        scorer = contract_scorer(contract, base)
        ref_loss = layout_losses(plan, found, "reference", pairing, vocab["reference"], scorer)
        cand_loss = layout_losses(plan, found, "candidate", pairing, vocab["candidate"], scorer)
        measured = measurement_comparison(store, contract, plan, bound_evidence, vocab, ref_loss, cand_loss) \
            if plan.measurements else None
        stopped = None
        used: list[int] = []
        d_low, d_high = difference_range(scorer)
        if plan.sequential is not None:
            used = list(plan.sequential.look_units(recorded_looks(plan, found, str(store.path))))
            ref_loss, cand_loss = ref_loss[used], cand_loss[used]
            stopped = sequential_stop(contract, plan, cand_loss - ref_loss, str(store.path), (d_low, d_high))
            check_stop_record(store, stopped, plan, found)
        inv_layouts = tuple(contract.invariance.layouts)
        if contract.invariance.required:
            differing, first = layout_invariance(plan, found, "candidate", inv_layouts)
        else:
            differing, first = 0, None
    # The decision's losses are evidence: each unit's loss typed by its package and bound to the record it was
    # scored from (invar.evidence), so the reference's cannot stand in for the candidate's, nor 0/1 losses for
    # losses in a declared range.
    units = list(range(len(plan.units))) if stopped is None else used
    ref_evidence = unit_evidence(plan, found, "reference", pairing)
    cand_evidence = unit_evidence(plan, found, "candidate", pairing)
    loss: TaskLoss | RangeTaskLoss
    d: np.ndarray
    if scorer.binary:
        reference = bound_losses(Reference, [ref_evidence[i] for i in units], ref_loss)
        candidate = bound_losses(Candidate, [cand_evidence[i] for i in units], cand_loss)
        d = candidate.values - reference.values
        loss = paired_loss(reference, candidate)
    else:
        ranged_ref = bound_range_losses(Reference, [ref_evidence[i] for i in units], ref_loss, scorer.loss_range)
        ranged_cand = bound_range_losses(Candidate, [cand_evidence[i] for i in units], cand_loss,
                                         scorer.loss_range)
        d = ranged_cand.values - ranged_ref.values
        loss = paired_range_loss(ranged_ref, ranged_cand)
    invariance = Invariance(contract.invariance.required, inv_layouts, differing == 0, len(plan.units),
                            differing, first)
    premises = check_premises(contract, base)

    req = contract.requirement
    task_bound: Bound | None = None
    diag: PairedDiagnostics | RangeDiagnostics | None = None
    delta: Decimal | None = None
    if req.standard == "population":
        assert req.method is not None
        assert req.delta is not None
        delta = req.delta
        if stopped is not None:
            final = stopped.final
            task_bound = Bound(stopped.method, stopped.version, final.n, stopped.delta, float(np.mean(d)),
                               final.lower, final.upper)
        elif scorer.binary:
            task_bound = bound(req.method, d.astype(np.float64), -1.0, 1.0, conservative_delta(delta))
        else:
            task_bound = _range_bound(req.method, d, d_low, d_high, conservative_delta(delta))
        if scorer.binary:
            diag = paired_diagnostics(loss.worse, loss.better, loss.n, conservative_delta(delta))
        else:
            diag = range_diagnostics(d, d_low, d_high, conservative_delta(delta))
    max_kl = None if contract.measurements is None else contract.measurements.max_kl
    kl = None if max_kl is None or measured is None else kl_requirement(measured, max_kl)
    answer, reason = decide(contract, invariance, premises, loss, task_bound, kl, stopped)
    return Decision(
        answer=answer, reason=reason, contract_name=contract.name, contract_sha256=sha, run=str(run_path),
        standard=req.standard, epsilon=req.epsilon, delta=delta, invariance=invariance,
        premises=premises, task_loss=loss, bound=task_bound, diagnostics=diag,
        evidence=tuple(found[c.key] for c in plan.calls if c.key in found), plan_version=plan.version,
        chain_head=verification.head, records=verification.records, measurements=measured,
        measurement_evidence=tuple(bound_evidence.measured[m.key] for m in plan.measurements), kl=kl,
        sequential=stopped,
    )


def _range_bound(method: str, d: np.ndarray, low: float, high: float, delta: float) -> Bound:
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


SEQUENTIAL_META = "sequential_stop"
"""The run's meta entry where `use run` records where the stopping rule stopped and the calls it used."""


def stop_record(decision: SequentialDecision, plan: ExecutionPlan, found: Mapping[str, CallEvidence]) -> dict[
        str, Any]:
    """The meta entry `use run` writes when the rule stops: the answer, look, units and the call digests it used."""
    looks = len(decision.looks)
    calls = [c for look in range(looks) for c in plan.look_calls(look)]
    return {"answer": decision.answer, "version": decision.version, "look": looks, "units": decision.stop,
            "calls": [[c.key, found[c.key].call_digest] for c in calls]}


def check_stop_record(store: RunStore, decision: SequentialDecision, plan: ExecutionPlan,
                      found: Mapping[str, CallEvidence]) -> None:
    """The stop `use run` recorded must be the one recomputed from the records (when the run recorded one)."""
    kept = store.meta().get(SEQUENTIAL_META)
    if kept is None:
        return
    expected = stop_record(decision, plan, found)
    if kept != expected:
        diff = _first_difference(expected, kept, SEQUENTIAL_META) or "it is encoded differently"
        raise EvidenceError(f"{store.path}: the stop the run recorded is not the one its records give: {diff}")


def _label(package: Package) -> str:
    parts: list[str] = [package.engine, package.dtype, package.quantization]
    if package.patches:
        parts.append("patches " + ",".join(sorted(package.patches)))
    return " ".join(parts)


def measurement_comparison(
    store: RunStore, contract: Contract, plan: ExecutionPlan, bound: BoundEvidence,
    vocab: Mapping[Role, ModelTokenizer],
    reference_loss: np.ndarray, candidate_loss: np.ndarray, *, large_step: float = DEFAULT_LARGE_STEP,
) -> NumericalComparison:
    """Every unit's pairing-layout responses compared, with the measurements of a plan /3 run (teacher forcing,
    captures streamed from `store`) on the units they cover (`invar.compare.measured`). `EvidenceError` for
    measurements that cannot be compared."""
    roles: tuple[Role, Role] = ("reference", "candidate")
    outputs: dict[Role, list[Response]] = {}
    texts: dict[Role, list[str | None]] = {}
    for role in roles:
        outs = layout_outputs(plan, bound.found, role, plan.pairing_layout)
        outputs[role] = [Response(o.tokens, o.logprobs, o.finish_reason) for o in outs]
        texts[role] = [vocab[role].decode(o.tokens.tolist()) for o in outs]
    # The comparison counts 0/1 losses; losses in a wider range are summarised by the decision's task loss only.
    binary = reference_loss.dtype.kind == "i"
    losses: dict[Role, list[int | None]] = {
        "reference": [int(x) if binary else None for x in reference_loss],
        "candidate": [int(x) if binary else None for x in candidate_loss]}
    sources = {"mode": "use run", "run": str(store.path), "contract": contract.name, "plan_version": plan.version,
               "reference": {"label": f"{contract.name} reference ({_label(contract.reference)})"},
               "candidate": {"label": f"{contract.name} candidate ({_label(contract.candidate)})"},
               "measurements": None if plan.measure is None else plan.measure.model_dump(mode="json")}
    try:
        return measured_comparison(
            store, [u.unit_id for u in plan.units], [u.prompt for u in plan.units], outputs,
            [bound.measured[m.key] for m in plan.measurements],
            teacher_forcing=plan.measure is None or plan.measure.teacher_forcing,
            texts=texts, losses=losses, large_step=large_step, sources=sources)
    except InputError as exc:
        raise EvidenceError(f"{store.path}: measurements: {exc}") from None


__all__ = [
    "DECISION_VERSION",
    "EXIT_CODES",
    "Answer",
    "BoundEvidence",
    "CallEvidence",
    "Decision",
    "Invariance",
    "Output",
    "OutputReader",
    "PremiseCheck",
    "RangeTaskLoss",
    "TaskLoss",
    "admit",
    "bind_records",
    "check_invariance",
    "check_premises",
    "collect_evidence",
    "decide",
    "diagnostics_json",
    "layout_invariance",
    "layout_losses",
    "layout_outputs",
    "measurement_comparison",
    "paired_task_loss",
    "parse_outputs",
    "read_anchors",
    "recorded_looks",
    "resolve_inputs",
    "run_contract_sha256",
    "run_inputs",
    "sequential_json",
    "sequential_rule",
    "sequential_stop",
    "stop_record",
    "stream_evidence",
    "task_losses",
    "unit_loss",
    "unit_range_loss",
]
