"""`compare numerical RUN [--contract C]`: a use run's numbers, from its records and its contract.

The run is read as admission reads it, by the same reader (`invar.contract.reading.RunReader`: the contract's
anchors, every record verified, bound to the plan and scored in one pass, `RunReader.read_scored`); the pairing
layout's responses are kept compactly as that pass binds them (`_Kept`, `_Responses`), and the captures of plan /3
measurements are read again side by side and dropped once compared: memory follows the number of units, not the
captures' size. Every unit's pairing-layout responses are compared; teacher forcing and captures
where the plan measured them. The units are compared one at a time (`invar.compare.measured.streamed_comparison`):
each unit's row goes to the caller's sink as it is made and only the aggregates' scalars are kept, so the report of
a million units is never held whole.

Decision: this lives in `invar.contract`, not `invar.compare`. Reading a use run means reading it under its
contract (anchors, plan, admission's binding of records), and the contract's own checks rest on `invar.compare`'s
computations; `compare` stays the layer below, computing from numbers it is given, and never imports the contract.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from invar.compare.measured import MeasuredItem, streamed_comparison
from invar.compare.numerical import DEFAULT_LARGE_STEP, InputError, Response, StreamedComparison, UnitPair, UnitResult
from invar.compare.outputs import CompareDecision
from invar.contract.admit import Step, admit
from invar.contract.bind import BoundEvidence, CallEvidence, Output
from invar.contract.decide import Decision
from invar.contract.model import read_contract
from invar.contract.plan import ExecutionPlan, PlannedCall, Role
from invar.contract.prepare import ROLES
from invar.contract.reading import RunReader, _label
from invar.errors import EvidenceError, InvarError
from invar.records import RunStore
from invar.records.store import is_run
from invar.tasks.population import thaw


def run_contract_path(run: Path) -> Path:
    """The contract file a use run names in its metadata (as `use run` was given it)."""
    with RunStore.open(run) as store:
        meta = store.meta().get("run", {})
    named = meta.get("contract") if isinstance(meta, dict) else None
    if meta.get("command") != "use run" or not isinstance(named, str):
        raise InvarError(f"{run}: not a use run; give a run made by invar use run, or REF_RUN CAND_RUN (two infer or "
                         "evaluate runs)")
    path = Path(named)
    if not path.is_file():
        raise InvarError(f"{run}: the contract the run names, {named}, is not there; pass --contract")
    return path


def compare_use_run(run: Path, contract_path: Path | None, *, large_step: float = DEFAULT_LARGE_STEP,
                    phase: Callable[[str], object] = lambda text: None,
                    progress: Callable[[Step], object] = lambda step: None,
                    row: Callable[[UnitResult], object] = lambda u: None) -> StreamedComparison:
    """Compare the reference and the candidate of a finished use run under its contract. `phase` is told each part
    as it starts; `progress`, the phases of admission's decision for the headline (`admit`'s); `row`, each unit's
    comparison in the plan's order, as it is made (the result keeps the aggregates only)."""
    if not is_run(run):
        raise InvarError(f"{run}: no run store here (expected records.sqlite); pass a run directory")
    contract_file = contract_path if contract_path is not None else run_contract_path(run)
    contract, sha = read_contract(contract_file)
    with RunStore.open(run) as store, tempfile.TemporaryDirectory(prefix="invar-compare-") as scratch:
        phase("reading the contract's inputs")
        stream = store.stream(kept=True)  # kept: the outputs are read again by call, as admission reads them
        stream.prime()  # the run's kept inputs verified and dropped before the plan is derived, as admission does
        reader = RunReader.of_run(contract, sha, contract_file.parent, store, Path(scratch))
        phase("reading the run's records under the contract")
        # One pass, as admission's: each record verified, bound and its outputs scored, the pairing layout's kept
        # compactly, then dropped.
        kept = _Kept(reader.plan)
        scored = reader.read_scored(store, stream=stream, keep=kept.visit)
        bound, losses = scored.bound, scored.losses
        if bound.nonfinite:
            first = bound.nonfinite[0]
            raise EvidenceError(f"{run}: the run closed at candidate call {first.key} (call id {first.call_id}), "
                                "answered NonFiniteOutput: the candidate has no outputs there to compare, and the "
                                f"calls after it were never made; use admit decides it (Violated) from that record")
        phase("comparing the numbers")
        result = _compared(reader, store, bound, losses, large_step, row, kept)
    result.sources["contract_file"] = str(contract_file)
    # The headline's decision is use admit's own, computed by the same function after the comparison is done
    # (so the two never hold their records at once); a run admission refuses is compared all the same.
    try:
        decision = decision_summary(admit(contract_file, run, progress=progress))
    except InvarError as exc:
        decision = CompareDecision(answer=None, reason=f"not decided: {exc}", bound=None)
    result.decision = decision
    return result


def _compared(reader: RunReader, store: RunStore, bound: BoundEvidence, losses: Mapping[Role, np.ndarray],
              large_step: float, row: Callable[[UnitResult], object], kept: _Kept) -> StreamedComparison:
    """`RunReader.measurements`' comparison, its units streamed: each reached unit's pair made from the bound outputs
    (`kept` as the pass bound them) when it is compared (its texts decoded then), its row handed to `row`, its
    expected answer shown."""
    plan, contract = reader.plan, reader.contract
    used = reader.reached_units(bound.found, str(store.path))
    outputs = {role: kept.responses(bound, role) for role in ROLES}
    # The comparison counts 0/1 losses; losses in a wider range are summarised by the decision's task loss only.
    binary = losses["reference"].dtype.kind == "i"

    def pair_at(k: int, cand_item: MeasuredItem | None, ref_item: MeasuredItem | None) -> UnitPair:
        i = used[k]
        unit = plan.units[i]
        ref, cand = outputs["reference"][i], outputs["candidate"][i]
        return UnitPair(
            unit.unit_id, unit.prompt, ref, cand,
            int(losses["reference"][i]) if binary else None,
            int(losses["candidate"][i]) if binary else None,
            reader.tokenizers["reference"].decode(ref.tokens.tolist()),
            reader.tokenizers["candidate"].decode(cand.tokens.tolist()),
            teacher_forced=None if cand_item is None else cand_item.logprobs,
            reference_scored=None if ref_item is None else ref_item.logprobs,
            expected=None if unit.source is None else _shown(thaw(unit.source.answer)))

    sources = {"mode": "use run", "run": str(store.path), "contract": contract.name, "plan_version": plan.version,
               "reference": {"label": f"{contract.name} reference ({_label(contract.reference)})"},
               "candidate": {"label": f"{contract.name} candidate ({_label(contract.candidate)})"},
               "measurements": None if plan.measure is None else plan.measure.model_dump(mode="json")}
    try:
        return streamed_comparison(
            store, len(used), pair_at, lambda k: plan.units[used[k]].unit_id,
            [bound.measured[m.key] for m in plan.measurements],
            teacher_forcing=plan.measure is None or plan.measure.teacher_forcing, large_step=large_step,
            sources=sources, row=row)
    except InputError as exc:
        raise EvidenceError(f"{store.path}: measurements: {exc}") from None


class _Kept:
    """Each pairing-layout call's outputs as the one pass binds them (`RunReader.read_scored`'s `keep`), kept
    compactly: the call's tokens and log-probabilities end to end, each output's length and finish reason. The records
    are then not decoded a second time to gather the responses (`responses`)."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self._plan = plan
        self._calls: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def visit(self, planned: PlannedCall, evidence: CallEvidence, outputs: tuple[Output, ...]) -> None:
        if planned.layout != self._plan.pairing_layout or planned.run != 1:
            return
        self._calls[planned.key] = (
            np.concatenate([o.tokens for o in outputs]) if outputs else np.zeros(0, dtype=np.int32),
            np.concatenate([o.logprobs for o in outputs]) if outputs else np.zeros(0, dtype=np.float32),
            np.array([o.tokens.size for o in outputs], dtype=np.int32),
            np.array([_Responses.FINISH.index(o.finish_reason) for o in outputs], dtype=np.uint8))

    def responses(self, bound: BoundEvidence, role: Role) -> _Responses:
        """`role`'s responses under the pairing layout, of the calls `bound` holds (a sequential run's reached looks:
        the units of calls never made are left empty and never read), in the plan's order; the calls' pieces are
        dropped as they are joined."""
        plan = self._plan
        n = len(plan.units)
        start, length = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int32)
        finish = np.zeros(n, dtype=np.uint8)
        tokens: list[np.ndarray] = []
        logprobs: list[np.ndarray] = []
        at = 0
        for c in plan.layout_calls(role, plan.pairing_layout):
            if c.key not in bound.found:
                continue
            toks, lps, lengths, finished = self._calls.pop(c.key)
            units = list(c.units)
            length[units], finish[units] = lengths, finished
            start[units] = at + np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) if units else 0
            at += toks.size
            tokens.append(toks)
            logprobs.append(lps)
        joined = (np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int32),
                  np.concatenate(logprobs) if logprobs else np.zeros(0, dtype=np.float32))
        # Outputs are int32 tokens and float32 log-probabilities (the protocol refuses others): joined, they keep
        # their dtypes, so each unit's view has the bits its record holds.
        assert joined[0].dtype == np.int32
        assert joined[1].dtype == np.float32
        return _Responses(*joined, start, length, finish)


class _Responses:
    """One package's pairing-layout responses, every planned unit's, kept compactly: the tokens (int32) and the
    log-probabilities (float32) of all units end to end, each unit's start, length and finish reason (`_Kept`); about
    9 bytes a token and 13 a unit, where each output held as decoded holds its report's bytes and three arrays."""

    FINISH = ("stop", "length")

    def __init__(self, tokens: np.ndarray, logprobs: np.ndarray, start: np.ndarray, length: np.ndarray,
                 finish: np.ndarray) -> None:
        self.tokens, self.logprobs, self.start, self.length, self.finish = tokens, logprobs, start, length, finish

    def __getitem__(self, index: int) -> Response:
        s, t = int(self.start[index]), int(self.length[index])
        return Response(self.tokens[s:s + t], self.logprobs[s:s + t], self.FINISH[int(self.finish[index])])


def _shown(answer: Any) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)


def decision_summary(d: Decision) -> CompareDecision:
    """What the report's headline shows of a decision: the answer, its reason, ε, δ, the bound and the task loss."""
    return CompareDecision(answer=d.answer.value, reason=d.reason, standard=d.standard, epsilon=str(d.epsilon),
                           delta=None if d.delta is None else str(d.delta),
                           bound=None if d.bound is None else d.bound.output(), task_loss=d.task_loss.output())


__all__ = ["compare_use_run", "decision_summary", "run_contract_path"]
