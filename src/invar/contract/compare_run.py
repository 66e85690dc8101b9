"""`compare numerical RUN [--contract C]`: a use run's numbers, from its records and its contract.

The run is read as admission reads it, by the same reader (`invar.contract.reading.RunReader`: the contract's
anchors, every record verified and bound to the plan), but as a stream (`RunReader.bind_streamed`), and the
captures of plan /3 measurements are read again side by side and dropped once compared: memory follows the number
of units, not the captures' size. Every unit's pairing-layout responses are compared; teacher forcing and captures
where the plan measured them.

Decision: this lives in `invar.contract`, not `invar.compare`. Reading a use run means reading it under its
contract (anchors, plan, admission's binding of records), and the contract's own checks rest on `invar.compare`'s
computations; `compare` stays the layer below, computing from numbers it is given, and never imports the contract.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invar.compare.numerical import DEFAULT_LARGE_STEP, NumericalComparison
from invar.contract.admit import Step, admit
from invar.contract.decide import Decision
from invar.contract.model import read_contract
from invar.contract.reading import RunReader
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
                    progress: Callable[[Step], object] = lambda step: None) -> NumericalComparison:
    """Compare the reference and the candidate of a finished use run under its contract. `phase` is told each part
    as it starts; `progress`, the phases of admission's decision for the headline (`admit`'s)."""
    if not is_run(run):
        raise InvarError(f"{run}: no run store here (expected records.sqlite); pass a run directory")
    contract_file = contract_path if contract_path is not None else run_contract_path(run)
    contract, sha = read_contract(contract_file)
    with RunStore.open(run) as store, tempfile.TemporaryDirectory(prefix="invar-compare-") as scratch:
        phase("reading the contract's inputs")
        stream = store.stream()
        stream.prime()  # the run's kept inputs verified and dropped before the plan is derived, as admission does
        reader = RunReader.of_run(contract, sha, contract_file.parent, store, Path(scratch))
        phase("reading the run's records under the contract")
        bound = reader.bind_streamed(store, stream)
        if bound.nonfinite:
            first = bound.nonfinite[0]
            raise EvidenceError(f"{run}: the run closed at candidate call {first.key} (call id {first.call_id}), "
                                "answered NonFiniteOutput: the candidate has no outputs there to compare, and the "
                                f"calls after it were never made; use admit decides it (Violated) from that record")
        phase("scoring the responses")
        losses = reader.losses(bound.found)
        phase("comparing the numbers")
        result = reader.measurements(store, bound, losses, large_step=large_step)
        expected = {u.unit_id: None if u.source is None else _shown(thaw(u.source.answer))
                    for u in reader.plan.units}
    result.sources["contract_file"] = str(contract_file)
    # By unit id: a sequential run stopped early compares the units of the looks it reached only.
    units = tuple(dataclasses.replace(u, expected=expected[u.unit_id]) for u in result.units)
    # The headline's decision is use admit's own, computed by the same function after the comparison is done
    # (so the two never hold their records at once); a run admission refuses is compared all the same.
    try:
        decision: dict[str, Any] = decision_summary(admit(contract_file, run, progress=progress))
    except InvarError as exc:
        decision = {"answer": None, "reason": f"not decided: {exc}", "bound": None}
    return dataclasses.replace(result, units=units, decision=decision)


def _shown(answer: Any) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)


def decision_summary(d: Decision) -> dict[str, Any]:
    """What the report's headline shows of a decision: the answer, its reason, ε, δ and the bound."""
    full = d.to_json()
    return {"answer": full["answer"], "reason": full["reason"], "standard": full["standard"],
            "epsilon": full["epsilon"], "delta": full["delta"], "bound": full["bound"],
            "task_loss": full["task_loss"]}


__all__ = ["compare_use_run", "decision_summary", "run_contract_path"]
