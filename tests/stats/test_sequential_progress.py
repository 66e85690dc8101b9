"""The stopping-n simulation tells its progress as a count of runs, and the count changes none of its figures."""

from __future__ import annotations

import numpy as np
import pytest

from invar.stats import sequential as seq

DELTA = 0.05


def test_simulation_counts_its_runs_chunk_by_chunk_with_the_same_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a chunk holds fewer runs than asked (here two runs of 2,000 units in a chunk of 4,000 units, as two
    runs of 2,000,000 units in the shipped chunk), `done` hears each chunk's end, up to every run; the stops and
    answers are those of the simulation told nothing."""
    monkeypatch.setattr(seq, "CHUNK_UNITS", 4000)
    told: list[int] = []
    args = ("paired-binary-sequence", 0.002, 0.002, 0.005, DELTA, 2000, 100, 5, 4)
    stops, answers = seq.simulate_stops(*args, done=told.append)
    assert told == [2, 4, 5]
    quiet_stops, quiet_answers = seq.simulate_stops(*args)
    assert np.array_equal(stops, quiet_stops)
    assert np.array_equal(answers, quiet_answers)


def test_plan_passes_the_count_on() -> None:
    told: list[int] = []
    plan = seq.sequential_plan("betting-sequence", 0.002, 0.002, 0.005, DELTA, 2000, 100, runs=50, seed=1,
                               done=told.append)
    assert told == [50]
    assert plan == seq.sequential_plan("betting-sequence", 0.002, 0.002, 0.005, DELTA, 2000, 100, runs=50, seed=1)
