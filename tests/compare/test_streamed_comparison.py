"""A comparison streamed unit by unit (`StreamedComparison`, what `compare numerical RUN --contract` builds) gives the
aggregates, the worst units and the rows of the comparison that holds every unit (`compare`), whatever the units:
bit-identical ones, ones that part at any step or share no prefix, teacher forcing of several lengths, captures, and
more worst-unit candidates than it keeps between cuts."""

from __future__ import annotations

import numpy as np
import pytest

from invar.compare import numerical
from invar.compare.numerical import (
    Capture,
    Response,
    StreamedComparison,
    UnitPair,
    UnitResult,
    compare,
    compare_captures,
    compare_unit,
)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=-1, keepdims=True)
    out: np.ndarray = (x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))).astype(np.float32)
    return out


def _pairs(n: int, seed: int) -> list[UnitPair]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(1, 7))
        ref_tokens = rng.integers(0, 9, length).astype(np.int32)
        ref_lp = -rng.random(length).astype(np.float32)
        kind = i % 4
        cand_tokens, cand_lp = ref_tokens.copy(), ref_lp.copy()
        if kind == 1:  # parts at some step
            at = int(rng.integers(0, length))
            cand_tokens[at] = (cand_tokens[at] + 1) % 9
        elif kind == 2:  # same tokens, other bits
            cand_lp = (ref_lp + rng.normal(0, 1e-3, length)).astype(np.float32)
        elif kind == 3:  # a longer response
            cand_tokens = np.concatenate([ref_tokens, [3]]).astype(np.int32)
            cand_lp = np.concatenate([ref_lp, [-0.5]]).astype(np.float32)
        taught = None if i % 5 == 0 else (ref_lp + rng.normal(0, 1e-2, length)).astype(np.float32)
        out.append(UnitPair(f"u{i:05d}", f"p{i}", Response(ref_tokens, ref_lp, "stop"),
                            Response(cand_tokens, cand_lp, "stop" if kind != 3 else "length"),
                            int(rng.integers(0, 2)), int(rng.integers(0, 2)), f"r{i}", f"c{i}",
                            teacher_forced=taught, reference_scored=ref_lp if i % 3 == 0 else None,
                            expected=str(i)))
    return out


def _captures(pairs: list[UnitPair], seed: int) -> list[tuple[Capture, Capture]]:
    rng = np.random.default_rng(seed)
    caps = []
    for p in pairs[::7]:
        steps = tuple(range(min(2, len(p.reference.tokens))))
        ref = _log_softmax(rng.normal(size=(len(steps), 9)))
        cand = _log_softmax(ref + rng.normal(0, 1e-2, size=ref.shape).astype(np.float32))
        caps.append((Capture(p.unit_id, steps, ref), Capture(p.unit_id, steps, cand)))
    return caps


@pytest.mark.parametrize(("n", "prune"), [(0, 4096), (1, 4096), (300, 4096), (300, 16)])
def test_streamed_aggregates_equal_the_held_comparison(n: int, prune: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamedComparison, "_PRUNE", prune)  # cut the worst candidates (and deltas) often
    pairs = _pairs(n, seed=n)
    caps = _captures(pairs, seed=1)
    held = compare(pairs, iter(caps), context="reference", large_step=0.005, sources={"mode": "test"})
    rows: list[UnitResult] = []
    streamed = StreamedComparison(0.005, "reference" if caps else None, {"mode": "test"}, rows.append)
    by_id = {ref.unit_id: compare_captures(p, ref, cand, "reference")
             for p in pairs for ref, cand in caps if ref.unit_id == p.unit_id}
    for p in pairs:
        streamed.add(compare_unit(p, by_id.get(p.unit_id, ()), 0.005))
    assert streamed.body() == held.body()
    assert [u.output() for u in rows] == [u.output() for u in held.units]
    assert streamed.generation().first_divergence == held.generation().first_divergence
    assert len(streamed.captures) == len(held.captures)
    # The ten worst kept while streaming (cut back every `prune` candidates) are those of one sort of every unit.
    key = numerical._worst_key
    every = sorted((u for u in rows if not u.sequence.identical or (u.captures and u.max_kl > 0)), key=key,
                   reverse=True)[:10]
    assert [u.unit_id for u in streamed.worst()] == [u.unit_id for u in every]
    assert streamed.output().units == []  # the rows went to the sink as they came


def _every_worst(units: list[UnitResult], count: int) -> list[str]:
    """The `count` worst of one sort of every candidate: what `worst(count)` must return."""
    key = numerical._worst_key
    return [u.unit_id for u in sorted((u for u in units if not u.sequence.identical or (u.captures and u.max_kl > 0)),
                                      key=key, reverse=True)[:count]]


def test_worst_honours_count_past_the_cut() -> None:
    # More worst-unit candidates than the streamed comparison holds before it cuts them back (4,096, as shipped).
    pairs = _pairs(5600, seed=7)
    caps = _captures(pairs, seed=2)
    held = compare(pairs, iter(caps), context="reference", large_step=0.005)
    candidates = _every_worst(held.units, len(held.units))
    assert len(candidates) > StreamedComparison._PRUNE
    for count in (0, 1, 10, 11, 500, len(candidates), len(candidates) + 5):
        assert [u.unit_id for u in held.worst(count)] == _every_worst(held.units, count)
    assert len(held.worst(500)) == 500
    streamed = StreamedComparison(0.005, "reference", keep_worst=500)
    for u in held.units:
        streamed.add(u)
    assert [u.unit_id for u in streamed.worst(500)] == _every_worst(held.units, 500)
    assert [u.unit_id for u in streamed.worst(10)] == _every_worst(held.units, 10)
    assert streamed.body() == held.body()  # the printed ten: the same whatever it keeps


def test_a_streamed_comparison_refuses_a_count_it_did_not_keep() -> None:
    streamed = StreamedComparison(0.005, None)
    for u in compare(_pairs(40, seed=3), large_step=0.005).units:
        streamed.add(u)
    assert len(streamed.worst(10)) == 10
    with pytest.raises(ValueError, match="keeps its 10 worst units, not 11"):
        streamed.worst(11)
    with pytest.raises(ValueError, match="negative"):
        streamed.worst(-1)
    with pytest.raises(ValueError, match="not -1"):
        StreamedComparison(0.005, None, keep_worst=-1)
