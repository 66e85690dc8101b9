"""The stopping-n simulation tells its progress as a count of runs, and the count changes none of its figures."""

from __future__ import annotations

import math

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


def _one_pass(method: str, p_worse: float, p_better: float, epsilon: float, delta: float, n_max: int, batch: int,
              runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The simulation as it was written before it went in segments: every run over all n_max units at once."""
    scales, weights = seq._components(method)
    m = (epsilon + 1.0) / 2.0
    stops = np.full(runs, n_max, dtype=np.int64)
    answers = np.zeros(runs, dtype=np.int8)
    chunk = max(1, min(runs, seq.CHUNK_UNITS // max(1, n_max)))
    ends = np.arange(batch, n_max + batch, batch)
    ends[-1] = n_max
    for start in range(0, runs, chunk):
        rows = min(chunk, runs - start)
        u = np.random.default_rng([seed, start]).random((rows, n_max))
        d = np.where(u < p_worse, 1.0, np.where(u >= 1.0 - p_better, -1.0, 0.0))
        x = (d + 1.0) / 2.0
        bets = (seq.trinomial_bets(d, delta, n_max) if method == "paired-binary-sequence"
                else seq.horizon_bets(x, delta, n_max))
        first = {}
        for side in ("upper", "lower"):
            logs = []
            for scale, weight in zip(scales, weights, strict=True):
                if side == "upper":
                    lam = np.minimum(scale * bets, seq.bounds.BET_CAP / (1.0 - m))
                    terms = np.log1p(-lam * (x - m))
                else:
                    lam = np.minimum(scale * bets, seq.bounds.BET_CAP / m)
                    terms = np.log1p(lam * (x - m))
                logs.append(math.log(weight) + np.cumsum(terms, axis=1))
            mixture = logs[0] if len(logs) == 1 else np.logaddexp.reduce(np.stack(logs), axis=0)
            running = np.maximum.accumulate(mixture, axis=1)[:, ends - 1] >= -math.log(delta)
            first[side] = np.where(running.any(axis=1), np.argmax(running, axis=1), ends.size)
        up, low = first["upper"], first["lower"]
        look = np.minimum(up, low)
        stopped = look < ends.size
        stops[start : start + rows] = np.where(stopped, ends[np.minimum(look, ends.size - 1)], n_max)
        answer = np.where(up < low, 1, np.where(low < up, -1, 0))
        answers[start : start + rows] = np.where(stopped, answer, 0).astype(np.int8)
    return stops, answers


@pytest.mark.parametrize("segment", [64, 1000, 65_536])
@pytest.mark.parametrize(("method", "p_worse", "p_better", "epsilon", "n_max", "batch"), [
    ("paired-binary-sequence", 0.01, 0.01, 0.005, 20_000, 100),
    ("paired-binary-sequence", 0.02, 0.0, 0.01, 3_050, 100),  # n_max not a whole number of looks; many Violated
    ("betting-sequence", 0.002, 0.002, 0.005, 5_000, 64),
    ("betting-sequence", 0.05, 0.05, 0.02, 4_000, 37),
])
def test_segments_stop_every_run_where_one_pass_does(segment: int, method: str, p_worse: float, p_better: float,
                                                    epsilon: float, n_max: int, batch: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs still undecided go on in segments of whole looks: every run's stop and answer are those of the
    single pass over all n_max units (first segments of one look, of ten, of all; each next one twice the last)."""
    monkeypatch.setattr(seq, "SEGMENT_UNITS", segment)
    got = seq.simulate_stops(method, p_worse, p_better, epsilon, DELTA, n_max, batch, 40, 3)
    want = _one_pass(method, p_worse, p_better, epsilon, DELTA, n_max, batch, 40, 3)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1])
    assert set(got[1].tolist()) != {0}  # runs that stopped are compared, not only the undecided


@pytest.mark.parametrize("method", ["paired-binary-sequence", "betting-sequence"])
def test_a_run_alone_in_its_chunk_draws_its_uniforms_as_needed(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each chunk holds one run (the largest n_max), its uniforms are drawn segment by segment, as far as the
    run goes: the same stops and answers as the single pass drawing all n_max at once."""
    monkeypatch.setattr(seq, "CHUNK_UNITS", 20_000)  # one run of 20,000 units per chunk
    monkeypatch.setattr(seq, "SEGMENT_UNITS", 1000)
    got = seq.simulate_stops(method, 0.01, 0.01, 0.005, DELTA, 20_000, 100, 12, 5)
    want = _one_pass(method, 0.01, 0.01, 0.005, DELTA, 20_000, 100, 12, 5)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1])
    assert int(np.min(got[0])) < 20_000  # some runs stopped before n_max: their draws ended early
