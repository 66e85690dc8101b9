"""Binding a run's evidence: each record of a run matched to the planned call of the owner's contract it executes.

The anchors come from outside the evidence: the contract fixes the packages and every planned call with its exact
parameters; the run only supplies records. Binding attributes each generate record to a package by its worker's
identity and the model that worker loaded, demands that every call of the plan is answered exactly once with
exactly the contract's parameters, checks each report's outputs against the requests they answer, and refuses
anything else by naming the record. It is its own module because three procedures bind the same way, all through
`invar.contract.reading.RunReader`: admission (`invar.contract.admit`) decides from the bound evidence, `use run`
(`invar.runner.use_run`) resumes from it, so a run resumes exactly where admission would say it stopped, and
`compare numerical RUN` compares it.

Binding keeps no outputs unless asked to: with an `OutputReader` the evidence reads each call's outputs again from
the store when a loss or an invariance check needs them, so a run's evidence takes memory per call, not per token.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from invar import canonical
from invar.compare.measured import MeasuredItem, MeasurementRecord
from invar.compare.runs import ScoredItem, check_score_output
from invar.contract.model import Contract, Package
from invar.contract.outputs import NonFiniteCallOutput
from invar.contract.plan import ExecutionPlan, MeasurementCall, PlannedCall, Role, measurement_params
from invar.errors import EvidenceError
from invar.evidence import Difference, EvidenceOutput, check_patches_active, first_difference
from invar.protocol.payloads import GenerateResult
from invar.records.store import CallRecord, CallStream, RunStore, Verification
from invar.stats.sequential import SequentialDecision


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

    def output(self) -> EvidenceOutput:
        """What a decision prints of it."""
        return EvidenceOutput(call=self.key, record=self.record_seq, call_id=self.call_id,
                              call_digest=self.call_digest, report_digest=self.report_digest)


def _first_difference(expected: Any, actual: Any, where: str) -> str | None:
    """The first place two decoded values differ (types included), as `where: what`; None if equal."""
    diff = first_difference(expected, actual, where)
    return None if diff is None else diff.said(_RECORD_WORDS)


def _other_value(d: Difference) -> str:
    e, a = d.expected, d.actual
    if isinstance(e, np.ndarray) and isinstance(a, np.ndarray):
        return (f"{d.where} is a {a.dtype} array of shape {a.shape} in the record, not the {e.dtype} array of shape "
                f"{e.shape} the plan and the recorded responses give")
    if isinstance(e, np.ndarray) or isinstance(a, np.ndarray):
        return f"{d.where} is {canonical.show(a)} in the record, {canonical.show(e)} in the contract"
    return f"{d.where} is {a!r} in the record, {e!r} in the contract"


_RECORD_WORDS: dict[str, Callable[[Difference], str]] = {
    "missing": lambda d: f"{d.where} is missing (the contract has {d.expected!r})",
    "unexpected": lambda d: f"{d.where} is not in the contract",
    "length": lambda d: f"{d.where} has {len(d.actual)} entries, the contract's has {len(d.expected)}",
    "other": _other_value,
}
"""How admission says where a record differs from what the contract and the plan give."""


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


def check_package_digests(result: Mapping[str, Any], package: Package, role: Role, where: str) -> None:
    """A report names its package's model and adapter digests; `EvidenceError` at `where` otherwise. `use run`
    checks each report on receipt with this, and admission each record again."""
    want = (package.model_digest, None if package.adapter is None else package.adapter.digest)
    got = (result.get("model_digest"), result.get("adapter_digest"))
    if got != want:
        raise EvidenceError(f"{where}: its report names model {str(got[0])[:16]}… adapter {str(got[1])[:16]}…, not "
                            f"the {role}'s model {want[0][:16]}… adapter {str(want[1])[:16]}…")


def check_package_report(result: Mapping[str, Any], package: Package, role: Role, where: str) -> None:
    """A generate or score report of `package`: its digests, and the patches it ran exactly the package's."""
    check_package_digests(result, package, role, where)
    check_patches_active(result, package.patches, where)


def score_outputs(result: Mapping[str, Any], items: Sequence[Any], where: str) -> list[ScoredItem]:
    """A score report's outputs, one per item of its call, each checked against its item (`check_score_output`)."""
    outputs = result.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(items):
        raise EvidenceError(f"{where}: the report does not answer its {len(items)} items")
    return [check_score_output(item, out, where) for item, out in zip(items, outputs, strict=True)]


def _check_loaded(rec: CallRecord, load: CallRecord, package: Package, role: Role) -> None:
    """The load report and the call's report both name the package's model and adapter digests, and the call's
    report ran the package's patches."""
    check_package_digests(_result(load), package, role, load.name)
    check_package_report(_result(rec), package, role, rec.name)


def parse_outputs(result: Mapping[str, Any], requests: Sequence[Mapping[str, Any]], eos: frozenset[int],
                  name: str) -> tuple[Output, ...]:
    """Check a generate result's outputs against the requests of its planned call (`eos`: the ids that end a
    response); `EvidenceError` naming the record `name`. A record whose params have the planned call's digest carries
    that call's requests: its own are passed, so the plan's are not derived again."""
    outputs = result.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(requests):
        n = len(outputs) if isinstance(outputs, list) else "no"
        raise EvidenceError(f"{name}: the report has {n} outputs for {len(requests)} requests")
    out: list[Output] = []
    for i, req in enumerate(requests):
        where = f"{name}: output {i}"
        o = outputs[i]
        if not isinstance(o, dict) or o.get("request_id") != req["request_id"]:
            got = o.get("request_id") if isinstance(o, dict) else None
            raise EvidenceError(f"{where} answers request {got!r}, expected {req['request_id']!r}")
    received = GenerateResult.received(result, name)
    for i, (o, req) in enumerate(zip(received.outputs, requests, strict=True)):
        where = f"{name}: output {i}"
        tokens = o.tokens
        if not _same_ids(o.prompt_tokens, req["prompt_ids"]):
            raise EvidenceError(f"{where} ({req['request_id']}): the engine ran other prompt tokens than the call "
                                "asked for")
        t = len(tokens)
        # a response is a few tokens: a set lookup per token, not np.isin's sort per output
        stops = [token in eos for token in tokens.tolist()]
        if o.finish_reason == "stop":
            if t == 0 or not stops[-1] or any(stops[:-1]):
                raise EvidenceError(f"{where} ({req['request_id']}): finish_reason stop, but the tokens do not end "
                                    "at the first end-of-sequence token")
        elif t != req["max_tokens"] or any(stops):
            raise EvidenceError(f"{where} ({req['request_id']}): finish_reason length with {t} tokens "
                                f"(max_tokens {req['max_tokens']}) or an end-of-sequence token inside")
        if t > req["max_tokens"]:
            raise EvidenceError(f"{where} ({req['request_id']}): {t} tokens exceed max_tokens {req['max_tokens']}")
        out.append(Output(req["request_id"], tokens, o.logprobs, o.finish_reason))
    return tuple(out)


def _same_ids(a: Any, b: Any) -> bool:
    """`np.array_equal(a, b)`, by the bytes where both are integer arrays of one dtype, by the Python ints where one is
    an integer vector and the other a list of ints (a prompt's ids, decoded)."""
    if type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype and a.dtype.kind in "iu":
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    if type(a) is np.ndarray and type(b) is list and a.ndim == 1 and a.dtype.kind in "iu" and \
            all(type(v) is int for v in b):
        # the engine's ids (an integer vector) against the call's (a list of ints, as a record decodes them):
        # equal exactly when the Python ints are, without converting the list to an array
        return bool(a.tolist() == b)
    return bool(np.array_equal(a, b))


def run_contract_sha256(store: RunStore) -> str:
    """The contract a run was made under (its meta `run.contract_sha256`); `EvidenceError` if it names none."""
    meta = store.meta("run").get("run", {})
    run_contract = meta.get("contract_sha256") if isinstance(meta, dict) else None
    if not isinstance(run_contract, str):
        raise EvidenceError(f"{store.path}: the run names no contract (meta run.contract_sha256); "
                            "admit only runs made with use run")
    return run_contract


NON_FINITE = "NonFiniteOutput"
"""The error type a worker answers a call with when the model's log-probabilities hold NaN (the package computed a
non-finite value): a candidate's generate call answered so decides admission by itself (docs/kernel-contracts.md)."""


@dataclass(frozen=True)
class NonFiniteCall:
    """A candidate generate call its worker answered with `NonFiniteOutput`: the planned call and the error record."""

    key: str
    first_unit: str
    """The unit id of the call's first request."""
    units: int
    record_seq: int
    call_id: int
    call_digest: str
    report_digest: str
    message: str
    """The worker's words (where in the batch, at which response step)."""

    def output(self) -> NonFiniteCallOutput:
        """What a decision and its receipt print of it."""
        return NonFiniteCallOutput(call=self.key, first_unit=self.first_unit, units=self.units, record=self.record_seq,
                                   call_id=self.call_id, call_digest=self.call_digest,
                                   report_digest=self.report_digest, error=f"{NON_FINITE}: {self.message}")


@dataclass
class BoundEvidence:
    """What a run's records bind to the plan: generate evidence and measurement records by plan call key, and why
    planned calls without a successful record have none (unanswered, or answered with an error)."""

    found: dict[str, CallEvidence]
    measured: dict[str, MeasurementRecord]
    failed: dict[str, str]
    nonfinite: list[NonFiniteCall] = field(default_factory=list)
    """The candidate's generate calls answered with `NonFiniteOutput`, in record order."""


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
    outputs = score_outputs(_result(rec), params["items"], rec.name)
    width = _result(load).get("vocab_size")
    scored: list[MeasuredItem] = []
    for index, got in zip(planned.units, outputs, strict=True):
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

    def read(self, seq: int, eos: frozenset[int], name: str) -> tuple[Output, ...]:
        if seq in self._recent:
            self._recent.move_to_end(seq)
            return self._recent[seq]
        rec = self._store.call_at(seq)  # the very bytes bound: its params are the planned call's
        outputs = parse_outputs(_result(rec), rec.call.params["requests"], eos, name)
        self._recent[seq] = outputs
        if len(self._recent) > self._keep:
            self._recent.popitem(last=False)
        return outputs


Visit = Callable[[PlannedCall, "CallEvidence", tuple["Output", ...]], None]
"""Told each generate call as it binds: the planned call, its evidence and its outputs, checked (while they are in
hand: a reader that scores them then never reads them again)."""


def bind_records(
    records: Iterable[CallRecord], contract: Contract, plan: ExecutionPlan, eos: Mapping[Role, frozenset[int]],
    reader: OutputReader | None = None, visit: Visit | None = None,
) -> BoundEvidence:
    """Bind each answered generate record, and under plan /3 each measurement (score) record, to the planned call
    it executes, by plan call key.

    Raises `EvidenceError`, naming the record, for a call from a foreign package, a call or parameter the plan does
    not contain, a repeated call, a report naming other files, or outputs the plan refuses. A measurement record
    must carry exactly the recorded responses the plan says it scores. A run that is still going (or was killed)
    binds as far as it got: `use run` resumes from this. Records may come in call order (`RunStore.calls`,
    `RunStore.iter_calls`) or report order (`RunStore.stream`). With a `reader`, each record's outputs are checked
    as they bind and then dropped; the evidence reads them again through it when asked. `visit` is told each bound
    generate call with its outputs.
    """
    # A later run of the determinism layout has its first run's params: a record binds the first call of its digest
    # not yet answered, in plan order.
    by_params: dict[tuple[Role, str], list[PlannedCall]] = {}
    for c in plan.calls:
        by_params.setdefault((c.package, c.params_digest), []).append(c)
    workers: dict[str, str] = {}
    by_items = {(m.package, tuple(plan.units[i].unit_id for i in m.units)): m for m in plan.measurements}
    # Only measurements look responses up by unit: a plan without them keeps no per-unit index.
    pairing = _PairingIndex(plan) if plan.measurements else None
    last_load: dict[str, CallRecord] = {}
    bound = BoundEvidence({}, {}, {})
    found, failed = bound.found, bound.failed
    for rec in records:
        method = rec.call.method
        answered = rec.report is not None and rec.report.report.ok
        if method == "load_model" and answered:
            last_load[rec.worker] = rec
        if method == "score" and pairing is not None:
            _bind_measurement(rec, last_load.get(rec.worker), contract, plan, pairing, by_items, bound)
            continue
        if method != "generate":
            continue  # scoring outside a plan's measurements does not enter the decision
        role = _attribute(rec, last_load.get(rec.worker), contract)
        params = rec.call.params
        runs = by_params.get((role, params_digest(params)))
        planned = None if runs is None else next((c for c in runs if c.key not in found), runs[-1])
        if planned is None:
            nearest = _nearest_call(plan, role, params)
            diff = _first_difference(nearest.params.to_wire(), params, "params") or "params are encoded differently"
            raise EvidenceError(f"{rec.name}: does not match planned call {nearest.key} (nor any other): {diff}")
        if not answered:
            reason = "was never answered" if rec.report is None else "was answered with an error"
            failed.setdefault(planned.key, f"{rec.name} {reason}")
            report = rec.report
            error = None if report is None else report.report.error
            if role == "candidate" and report is not None and error is not None and error.type == NON_FINITE:
                bound.nonfinite.append(NonFiniteCall(
                    planned.key, plan.units[planned.units[0]].unit_id, len(planned.units), rec.seq,
                    rec.call.call_id, rec.call_digest, report.report_digest, error.message))
            continue
        if planned.key in found:
            raise EvidenceError(f"{rec.name}: repeats planned call {planned.key}, already answered by record "
                                f"{found[planned.key].record_seq}")
        if planned.run > 1 and workers.get(planned.run_key(1)) == rec.worker:
            raise EvidenceError(f"{rec.name}: answers planned call {planned.key}, a run again of "
                                f"{planned.run_key(1)}, from the worker that answered that call (record "
                                f"{found[planned.run_key(1)].record_seq}); determinism needs a worker started afresh "
                                "for the later run")
        load = last_load[rec.worker]
        _check_loaded(rec, load, contract.package(role), role)
        workers[planned.key] = rec.worker
        assert rec.report is not None
        outputs = parse_outputs(_result(rec), params["requests"], eos[role], rec.name)
        evidence = found[planned.key] = CallEvidence(
            key=planned.key, package=role, layout=planned.layout, record_seq=rec.seq, call_id=rec.call.call_id,
            call_digest=rec.call_digest, report_digest=rec.report.report_digest,
            kept=outputs if reader is None else None,
            reread=None if reader is None else functools.partial(reader.read, rec.seq, eos[role], rec.name),
        )
        if visit is not None:
            visit(planned, evidence, outputs)
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
    store: RunStore, contract: Contract, sha256: str, plan: ExecutionPlan, eos: Mapping[Role, frozenset[int]],
    stream: CallStream | None = None,
) -> BoundEvidence:
    """As `collect_evidence`, reading the store once as a stream (`RunStore.stream`; `stream`, perhaps primed, when
    given) instead of holding every record: the same checks, though a record the plan refuses may be named before a
    damaged record later in the store."""
    if stream is None:
        stream = store.stream()
    bound = bind_records(stream, contract, plan, eos)
    if stream.verification is None or not stream.verification.closed:
        raise _incomplete(store)
    _check_run_contract(store, sha256)
    return _complete(store, plan, bound)


def bind_in_one_pass(
    store: RunStore, contract: Contract, sha256: str, plan: ExecutionPlan, eos: Mapping[Role, frozenset[int]],
    visit: Visit, progress: Callable[[int, int], object] | None = None, expect_head: str | None = None,
    stream: CallStream | None = None,
) -> tuple[BoundEvidence, Verification]:
    """As `collect_evidence`, reading and decoding each record once: the store is verified as a stream
    (`RunStore.stream`) and each generate record bound as it comes, its outputs handed to `visit` and dropped (the
    evidence reads them again from `store` when asked, which the pass leaves verified). The refusals are
    `collect_evidence`'s, in its order: a damaged store (`RecordError`), a head other than `expect_head`, an
    incomplete run, a run of another contract, then the first record binding refuses (held while the rest of the
    store is verified). `progress(done, total)` is told the calls read, as `RunStore.verify` tells them. `stream`:
    the pass to read, `store.stream(kept=True)` (perhaps primed) when given, else one made here."""
    if stream is None:
        stream = store.stream(kept=True)
    total = store.call_count
    done = 0

    def counted() -> Iterator[CallRecord]:
        nonlocal done
        for rec in records:
            yield rec
            done += 1
            if progress is not None:
                progress(done, total)

    if progress is not None:
        progress(0, total)
    records = iter(stream)
    held: EvidenceError | None = None
    try:
        bound = bind_records(counted(), contract, plan, eos, OutputReader(store), visit)
    except EvidenceError as exc:
        held, bound = exc, BoundEvidence({}, {}, {})
        for _ in counted():  # the rest of the store is verified before the refusal is raised
            pass
    verification = store.verify(expect_head=expect_head)  # the pass just made, kept by the store
    if not verification.closed:
        raise _incomplete(store)
    _check_run_contract(store, sha256)
    if held is not None:
        raise held
    return _complete(store, plan, bound), verification


def params_digest(params: Any) -> str:
    """`canonical.digest(params)` of params decoded from a record, packed by msgpack in C: a decoded value holds
    only exact plain types, its maps in sorted order and its arrays contiguous little-endian views (`canonical.decode`
    refuses anything else), so the document msgpack writes for it is the canonical one, arrays placed where
    `canonical.encode` places them. Anything else (a value built here, not decoded) goes to `canonical.digest`."""
    blobs: list[bytes | memoryview] = []
    offset = 0

    def array(obj: Any) -> msgpack.ExtType:
        nonlocal offset
        if type(obj) is not np.ndarray or obj.dtype.str not in canonical._ALLOWED_DTYPES or not obj.flags.c_contiguous:
            raise _NotPlain
        pad = -offset % canonical._ALIGN
        if pad:
            blobs.append(bytes(pad))
            offset += pad
        raw = obj.reshape(-1).data.cast("B")
        ext = msgpack.ExtType(canonical.ARRAY_EXT, msgpack.packb([obj.dtype.str, list(obj.shape), offset, raw.nbytes]))
        blobs.append(raw)
        offset += raw.nbytes
        return ext

    try:
        doc = msgpack.packb(params, use_bin_type=True, strict_types=True, default=array)
    except _NotPlain:
        return canonical.digest(params)
    h = hashlib.sha256(len(doc).to_bytes(4, "big"))
    h.update(doc)
    if blobs:
        h.update(bytes(-(4 + len(doc)) % canonical._ALIGN))
        for blob in blobs:
            h.update(blob)
    return h.hexdigest()


class _NotPlain(Exception):
    """A value `params_digest` leaves to `canonical.digest`."""


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
    if bound.nonfinite:
        # A candidate call answered with non-finite values decides the run by itself: `use run` closed it there, and
        # the calls it never made are not needed (admission decides Violated from that record).
        return bound
    if plan.sequential is not None:
        # The stopping rule, not the plan's length, says how many looks a run holds: admit checks that.
        recorded_looks(plan, bound.found, str(store.path))
        return bound
    for c in plan.calls:
        if c.key not in bound.found:
            why = f" ({bound.failed[c.key]})" if c.key in bound.failed else ""
            raise EvidenceError(f"{store.path}: planned call {c.key} (generate, {len(c.units)} requests) "
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
        return (c.first_request_id == first, canonical.digest(c.batches) == layout)

    return max(mine, key=score)


def layout_outputs(plan: ExecutionPlan, found: Mapping[str, CallEvidence], package: Role,
                   layout: str, *, units: Sequence[int] | None = None) -> list[Output]:
    """One package's outputs under one layout, gathered from all its calls into the plan's unit order, or of
    `units` only, in that order (a sequential run's reached looks: the calls of later looks are not on record)."""
    outputs: list[Output | None] = [None] * len(plan.units)
    for c in plan.layout_calls(package, layout):
        if c.key in found:
            for index, output in zip(c.units, found[c.key].outputs, strict=True):
                outputs[index] = output
    picked = [outputs[i] for i in (range(len(plan.units)) if units is None else units)]
    if any(o is None for o in picked):
        raise KeyError(next(c.key for c in plan.layout_calls(package, layout) if c.key not in found))
    return [o for o in picked if o is not None]


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


__all__ = [
    "NON_FINITE",
    "SEQUENTIAL_META",
    "BoundEvidence",
    "CallEvidence",
    "NonFiniteCall",
    "Output",
    "OutputReader",
    "Visit",
    "bind_in_one_pass",
    "bind_records",
    "check_stop_record",
    "collect_evidence",
    "layout_outputs",
    "params_digest",
    "parse_outputs",
    "recorded_looks",
    "run_contract_sha256",
    "stop_record",
    "stream_evidence",
]
