"""paired-binary-score's cell bounds, thresholds and exact power as `score` computes them now against the code they
replace, to the bit: `Bounder` (a cell's bound asked again with the same thresholds read back, memo windows of 4
thresholds NaN-filled when placed, read in one gather per kind, cells written into the store in place) against the
Bounder as written before (`_ReferenceBounder`: every bound computed, windows of 16, the whole memo NaN-filled when
allocated; kept here verbatim) on batches with recurring cells, distinct and not, at two levels α, over many calls,
and in the planner's exact and top powers and thresholds on a grid of assumptions, ε, δ and n; and
`Ordering.thresholds_many` against `Ordering.thresholds` one t at a time."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from invar.stats import planning, score
from invar.stats.score import (
    _FRESH,
    _KINDS,
    _PER_COUNT,
    FloatArray,
    IntArray,
    _Cells,
    _direct,
    _values_at,
    _ValueSource,
)

_WIDTH_BEFORE = 16
# `_blank`, `_pad` and `_subset` below are score's helpers as they were (the reference's store growth uses them)


def _subset(cells: _Cells, rows: IntArray) -> _Cells:
    """The rows of a batch of cells."""
    return _Cells(**{name: getattr(cells, name)[rows] for name in cells.__dataclass_fields__})


def _blank(cells: _Cells, rows: int) -> _Cells:
    """Storage for `rows` cells shaped like `cells` (contents unspecified until filled)."""
    return _Cells(
        **{
            name: np.zeros((rows, *getattr(cells, name).shape[1:]), dtype=getattr(cells, name).dtype)
            for name in _Cells.__dataclass_fields__
        }
    )


def _pad(cells: _Cells, width: int) -> _Cells:
    """`cells` with its count axis padded to `width` (masked out, counts repeated)."""
    extra = width - cells.k.shape[1]
    if extra == 0:
        return cells
    fields = {}
    for name in _Cells.__dataclass_fields__:
        value = getattr(cells, name)
        if name in _PER_COUNT:
            fill = value[:, -1:] if name == "k" else np.zeros((value.shape[0], 1), dtype=value.dtype)
            value = np.concatenate([value, np.repeat(fill, extra, axis=1)], axis=1)
        fields[name] = value
    return _Cells(**fields)


@dataclass
class _ReferenceBounder(score.Bounder):
    """`score.Bounder` with its memo as written before (verbatim, its window 16 thresholds wide)."""

    memo: FloatArray = field(default_factory=lambda: np.zeros((_KINDS, 0, 1, _WIDTH_BEFORE)))

    def _append(self, cells: _Cells) -> None:
        """Add cells to the store, growing its rows (and count axis) geometrically (amortised constant cost)."""
        used = len(self.keys) - cells.a1.size
        rows = used + cells.a1.size
        if self.store is None or rows > self.store.a1.size or cells.k.shape[1] > self.store.k.shape[1]:
            old_rows = 0 if self.store is None else self.store.a1.size
            old_width = 0 if self.store is None else self.store.k.shape[1]
            capacity = max(rows, 2 * old_rows, 16)
            wide = old_width if cells.k.shape[1] <= old_width else max(cells.k.shape[1], old_width + old_width // 4)
            grown = _pad(_blank(cells, capacity), wide)
            if self.store is not None and used:
                old = _pad(_subset(self.store, np.arange(used)), wide)
                for name in _Cells.__dataclass_fields__:
                    getattr(grown, name)[:used] = getattr(old, name)
            self.store = grown
            seen = np.zeros(capacity, dtype=np.int64)
            seen[:used] = self.seen[:used]
            memo_row = np.full(capacity, -1, dtype=np.int64)
            memo_row[:used] = self.memo_row[:used]
            self.seen, self.memo_row = seen, memo_row
            if self.memo_used and wide > self.memo.shape[2]:
                self._grow_memo(self.memo.shape[1], wide)
        add = _pad(cells, self.store.k.shape[1])
        for name in _Cells.__dataclass_fields__:
            getattr(self.store, name)[used:rows] = getattr(add, name)


    def _grow_memo(self, rows: int, width: int) -> None:
        memo = np.full((_KINDS, rows, width, _WIDTH_BEFORE), np.nan)
        c0 = np.full((rows, width), _FRESH, dtype=np.int64)
        memo[:, : self.memo_used, : self.memo.shape[2]] = self.memo[:, : self.memo_used]
        c0[: self.memo_used, : self.memo_c0.shape[1]] = self.memo_c0[: self.memo_used]
        self.memo, self.memo_c0 = memo, c0


    def _source(self, places: IntArray, cells: _Cells) -> _ValueSource:
        fresh_source = _direct(cells)

        def values(rows: IntArray, ck: IntArray, kinds: tuple[int, ...]) -> list[FloatArray]:
            kept = places[rows] >= 0
            if not kept.any():
                return fresh_source(rows, ck, kinds)
            out = [np.zeros(ck.shape) for _ in kinds]
            if (~kept).any():
                for i, value in enumerate(fresh_source(rows[~kept], ck[~kept], kinds)):
                    out[i][~kept] = value
            r_kept = rows[kept]
            ck_kept = ck[kept]
            s = places[r_kept]
            used = ck.shape[1]  # the batch may be narrower than the memo
            if np.any(self.memo_c0[s, :used] == _FRESH):
                # one window per (cell, count), placed by the first row that meets it (a cell may recur in a batch)
                unique, first = np.unique(s, return_index=True)
                known = self.memo_c0[unique, :used]
                self.memo_c0[unique, :used] = np.where(known == _FRESH, ck_kept[first] - _WIDTH_BEFORE // 2, known)
            col = ck_kept - self.memo_c0[s, :used]
            inside = (col >= 0) & (col < _WIDTH_BEFORE)
            position = s[:, None] * self.memo.shape[2] + np.arange(used)[None, :]
            flat = position * _WIDTH_BEFORE + np.clip(col, 0, _WIDTH_BEFORE - 1)
            mask = cells.mask[r_kept]
            for i, kind in enumerate(kinds):
                table = self.memo[kind].reshape(-1)
                got = np.where(inside, table[flat], np.nan)
                need = np.isnan(got) & mask
                if need.any():
                    # each (cell, count, threshold) once, however many outcomes share it; stored, then read back
                    stored = need & inside
                    if stored.any():
                        spots, first = np.unique(flat[stored], return_index=True)
                        rr, cc = np.nonzero(stored)
                        rr, cc = rr[first], cc[first]
                        table[spots] = _values_at(cells, r_kept[rr], cc, ck_kept[rr, cc], kind)
                        got = np.where(inside, table[flat], np.nan)
                    loose = need & ~inside  # outside the window: computed, not kept
                    if loose.any():
                        rr, cc = np.nonzero(loose)
                        got[rr, cc] = _values_at(cells, r_kept[rr], cc, ck_kept[rr, cc], kind)
                out[i][kept] = np.where(mask, got, 0.0)
            return out

        return values


@pytest.mark.parametrize(("n", "delta", "epsilon"), [(2000, 0.05, 0.004), (6000, 0.01, 0.005), (800, 0.05, -0.01)])
def test_bounds_are_the_reference_memos(n: int, delta: float, epsilon: float) -> None:
    """Batches of cells asked about several times (the memo's rows), recurring inside a batch or not, by outcomes
    whose extreme sets differ by a few thresholds (the windows, and counts outside them)."""
    rng = np.random.default_rng(n)
    bits = score.grid_bits(n)
    delta0 = score.grid_point(score.grid_floor(epsilon, bits), bits)
    ordering = score.Ordering(n, score.order_z(delta))
    k = int(0.02 * n)
    tests = [score.make_test(w, k - w, n, delta, ordering) for w in range(k // 2 - 6, k // 2 + 7, 2)]
    alphas = (tests[0].alpha, 0.5 * tests[0].alpha)
    lo, hi = max(0.0, delta0), max(t.pi_upper for t in tests)
    reach = int(score.k_ranges(n, np.array([hi]), np.array([hi]))[1][0])
    # each outcome's thresholds over every count a cell below U_π sums (as the planner builds them)
    matrix = np.stack([ordering.thresholds(ordering.statistic(w, k - w), reach)
                       for w in range(k // 2 - 6, k // 2 + 7, 2)])
    e = score.edges(n)
    cells = [(float(a), float(b)) for a, b in itertools.pairwise(e) if b >= lo and a <= hi]
    cells += [(a + (b - a) * j / 4, a + (b - a) * (j + 1) / 4) for a, b in cells[:6] for j in range(4)]
    cells += [(a, a) for a, _ in cells[:5]]  # points
    now, before = score.Bounder(n, delta0), _ReferenceBounder(n, delta0)
    compared = 0
    for step in range(24):
        recur = step % 3 == 0  # every third batch: a cell may recur in it
        size = int(rng.integers(1, 40 if recur else len(cells) + 1))
        pick = rng.choice(len(cells), size=size, replace=recur)
        a1 = np.maximum(np.array([cells[i][0] for i in pick]), lo)
        a2 = np.minimum(np.array([cells[i][1] for i in pick]), hi)
        owner = rng.integers(0, len(tests), size=size)
        alpha = alphas[step % 2]
        got = now.bounds(matrix, a1, a2, alpha, owner)
        expected = before.bounds(matrix, a1, a2, alpha, owner)
        assert got.tobytes() == expected.tobytes(), step
        fresh = np.concatenate([
            score.Bounder(n, delta0, remember=False).bounds(matrix[o], a1[i : i + 1], a2[i : i + 1], alpha)
            for i, o in enumerate(owner.tolist())
        ])
        assert got.tobytes() == fresh.tobytes(), step
        compared += size
    assert now.memo_used > 0
    assert 0 < len(now.known) < compared  # some bounds were read back
    assert compared > 200


GRID = [  # p_worse, p_better, ε, δ, n
    (0.01, 0.01, 0.01, 0.05, 1357), (0.01, 0.01, 0.005, 0.05, 5101), (0.02, 0.01, 0.02, 0.05, 3000),
    (0.01, 0.01, 0.02, 0.01, 900), (0.003, 0.001, 0.005, 0.05, 2500), (0.05, 0.05, 0.05, 0.1, 1200),
]


def _planned(case: tuple[float, float, float, float, int]) -> tuple[str, str, dict[int, int]]:
    pw, pb, eps, dlt, n = case
    planner = planning._ScorePlanner(planning._assumption(pw, pb, None, 0.0, -1.0, 1.0), eps, dlt)
    top = planner.top_power(n)
    exact = planner.power(n)
    return top.hex(), exact.hex(), planner.previous


@pytest.mark.parametrize("case", GRID, ids=str)
def test_exact_power_is_the_reference_memos(case: tuple[float, float, float, float, int],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    now = _planned(case)
    monkeypatch.setattr(score, "Bounder", _ReferenceBounder)
    before = _planned(case)
    assert now == before
    assert 0.0 < float.fromhex(now[1]) < 1.0


@pytest.mark.parametrize(("n", "delta"), [(1357, 0.05), (10660, 0.01), (300, 0.1)])
def test_thresholds_many_are_thresholds_one_by_one(n: int, delta: float) -> None:
    """Every threshold vector `Ordering.thresholds_many` gives is `thresholds`' for that t alone, on a fresh ordering
    of its own: at statistics the table holds (ties), between them, above every stored one, and below the floor
    (where it asks `thresholds` itself)."""
    z = score.order_z(delta)
    k = int(0.02 * n)
    reach = int(score.k_ranges(n, np.array([0.05]), np.array([0.05]))[1][0])
    ordering = score.Ordering(n, z)
    ordering.prepare(0.0, reach)
    stats = [ordering.statistic(w, k - w) for w in range(k // 3, k)]
    groups = [stats, [np.nextafter(t, 1.0) for t in stats[::3]], [t + 1e-4 for t in stats[::5]], [0.5, stats[0]],
              [-0.05, *stats[:4]]]
    for ts in groups:
        many = ordering.thresholds_many(np.array(ts), reach)
        alone = np.stack([score.Ordering(n, z).thresholds(t, reach) for t in ts])
        assert np.array_equal(many, alone), ts
    assert len({tuple(row) for row in many}) > 1  # the rows differ: the test is not vacuous
