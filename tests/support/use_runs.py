"""What the `use run` tests compare between two runs of one contract: the decision's figures and each planned call's
outputs, both recomputed from the records by admission (a resumed, replaced or differently placed run must give
those of an uninterrupted one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invar import canonical
from invar.contract.admit import admit
from invar.records import RunStore


def outputs_by_call(run: Path, contract: Path) -> dict[str, str]:
    """Each planned call's outputs, as a digest, by the planned call's key."""
    decision = admit(contract, run)
    with RunStore.open(run) as store:
        by_seq = {c.seq: c for c in store.calls()}
    out = {}
    for e in decision.evidence:
        rep = by_seq[e.record_seq].report
        assert rep is not None
        out[e.key] = canonical.digest(rep.report.result["outputs"])  # type: ignore[index]
    return out


def decision_figures(run: Path, contract: Path) -> dict[str, Any]:
    """The decision's answer, reason, task loss, bound, invariance and diagnostics."""
    d = admit(contract, run).output().model_dump(mode="json", exclude_unset=True)
    return {k: d[k] for k in ("answer", "reason", "task_loss", "bound", "invariance", "diagnostics")}
