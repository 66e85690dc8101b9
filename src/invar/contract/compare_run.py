"""`compare numerical RUN [--contract C]`: a use run's numbers, from its records and its contract.

The run is read as admission reads it (the contract's anchors, every record verified and bound to the plan), but as
a stream (`invar.contract.admit.stream_evidence`), and the captures of plan /3 measurements are read again side by
side and dropped once compared: memory follows the number of units, not the captures' size. Every unit's
pairing-layout responses are compared; teacher forcing and captures where the plan measured them.

Decision: this lives in `invar.contract`, not `invar.compare`. Reading a use run means reading it under its
contract (anchors, plan, admission's binding of records), and the contract's own checks rest on `invar.compare`'s
computations; `compare` stays the layer below, computing from numbers it is given, and never imports the contract.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from invar.compare.numerical import DEFAULT_LARGE_STEP, NumericalComparison
from invar.contract.admit import layout_losses, measurement_comparison, read_anchors, stream_evidence
from invar.contract.model import read_contract
from invar.contract.plan import Role
from invar.contract.prepare import contract_scorer
from invar.errors import InvarError
from invar.records import RunStore
from invar.records.store import is_run


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


def compare_use_run(run: Path, contract_path: Path | None, *, large_step: float = DEFAULT_LARGE_STEP
                    ) -> NumericalComparison:
    """Compare the reference and the candidate of a finished use run under its contract."""
    if not is_run(run):
        raise InvarError(f"{run}: no run store here (expected records.sqlite); pass a run directory")
    contract_file = contract_path if contract_path is not None else run_contract_path(run)
    contract, sha = read_contract(contract_file)
    roles: tuple[Role, Role] = ("reference", "candidate")
    with RunStore.open(run) as store, tempfile.TemporaryDirectory(prefix="invar-compare-") as scratch:
        plan, vocab = read_anchors(contract, sha, contract_file.parent, store, Path(scratch))
        bound = stream_evidence(store, contract, sha, plan, {r: frozenset(vocab[r].eos_token_ids) for r in roles})
        scorer = contract_scorer(contract, contract_file.parent)
        losses = {role: layout_losses(plan, bound.found, role, plan.pairing_layout, vocab[role], scorer)
                  for role in roles}
        result = measurement_comparison(store, contract, plan, bound, vocab, losses["reference"],
                                        losses["candidate"], large_step=large_step)
    result.sources["contract_file"] = str(contract_file)
    return result


__all__ = ["compare_use_run", "run_contract_path"]
