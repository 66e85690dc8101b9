"""Admission at scale holds per unit only what the decision needs (issue 49): the Python heap it holds once every
record is read grows by a small constant per unit, measured at two sizes of one contract (`tracemalloc`, not timed),
and it counts every unit at both."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest
from contract_runs import CANDIDATE_IDENTITY, RunWriter, Workspace, make_workspace, unit_ids

from invar.contract.admit import Step, admit
from invar.contract.decide import Answer, Decision

SIZES = (128, 768)
PER_UNIT = 200
"""Bytes of Python heap per unit admission may hold after reading the records: the population's unit in its compact
table (its id, prompt and answer as slices of one string, its kind as an index; the unit is built when read), its
seed, its index in each layout and its losses (about 145 bytes together, measured; 0.38 KiB before the table); a
report's outputs are dropped as each record is scored, so nothing here grows with the responses."""


def _admit_traced(ws: Workspace, run: Path) -> tuple[Decision, int]:
    """Admission's decision and the Python heap it holds once every record is read (what it keeps per unit)."""
    held: list[int] = []

    def step(s: Step) -> None:
        if s.phase == "scoring the losses":
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0] - base)

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        decision = admit(ws.contract_path, run, progress=step)
    finally:
        tracemalloc.stop()
    return decision, held[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Workspace, Path]]:
    out = {}
    for n in SIZES:
        ws = make_workspace(tmp_path_factory.mktemp(f"scale{n}"), units=n, execution={"requests_per_call": 64},
                            invariance={"required": False, "layouts": None}, layouts={"solo": {"batch_size": 1}},
                            candidate={"patches": None})
        writer = RunWriter(ws, ws.root / "run")
        # an unpatched candidate (NF4 against FP32), so the run needs no patch folder
        ref = writer.worker("reference")
        cand = writer.worker("candidate", {**CANDIDATE_IDENTITY, "settings": {"device": "cpu", "threads": 1}})
        wrong = unit_ids(ws, n // 64)
        for planned in ws.plan.calls:
            candidate = planned.package == "candidate"
            writer.generate(cand if candidate else ref, planned, wrong if candidate else ())
        out[n] = (ws, writer.close())
    return out


def test_admission_holds_a_small_constant_per_unit(runs: dict[int, tuple[Workspace, Path]]) -> None:
    small, large = SIZES
    ws, run = runs[small]
    admit(ws.contract_path, run)  # the first admission of the process imports what deciding needs: not counted
    held = {}
    for n in SIZES:
        ws, run = runs[n]
        decision, held[n] = _admit_traced(ws, run)
        assert decision.answer in (Answer.ADMITTED, Answer.UNKNOWN)
        assert decision.task_loss.n == n
        assert decision.task_loss.worse == n // 64
    per_unit = (held[large] - held[small]) / (large - small)
    assert per_unit < PER_UNIT, f"admission holds {per_unit:.0f} bytes per unit ({held})"
