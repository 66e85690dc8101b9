"""What `compare` prints that the core returns: the comparison of two training runs (one spelling), and a use
run's `max_kl` requirement as admission checked it.

`invar.compare.histories` builds it, and `compare histories --json` prints it as it is.
"""

from __future__ import annotations

from typing import Any, Literal

from invar.printed import Closed


class KlRequirementOutput(Closed):
    max_kl: str
    holds: bool
    violated: bool
    captures: int
    worst: str | None


class TensorDiffOutput(Closed):
    """Where two checkpoints' tensors part: the first differing tensor and the totals over all of them."""

    file: str
    tensor: str
    elements: int
    size: int
    max_abs_delta: float
    tensors_differing: int
    elements_differing: int


class CycleHistoriesRow(Closed):
    cycle: int
    identical: bool
    checkpoint_a: str
    checkpoint_b: str
    checkpoints_identical: bool
    consumed_same: bool
    responses_same: bool
    diff: TensorDiffOutput | None


class HistoriesRun(Closed):
    run: str
    closed: bool
    chain_head: str
    cycles: int


class CompareHistoriesOutput(Closed):
    """`invar compare histories --json` (exit 0 identical, 10 differ)."""

    verdict: Literal["identical", "differ"]
    runs: list[HistoriesRun]
    schedule_knobs_differing: dict[str, list[Any]]
    """Knob → [run A's value, run B's value], for the schedule knobs that differ."""
    cycles_compared: int
    first_differing_cycle: int | None
    cycles: list[CycleHistoriesRow]


__all__ = ["CompareHistoriesOutput", "CycleHistoriesRow", "HistoriesRun", "KlRequirementOutput", "TensorDiffOutput"]
