"""The bound functions: the seed decision, their API, their errors and the properties every bound must have."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.errors import InvarError
from invar.stats import (
    DEFAULT_BINARY_METHOD,
    METHODS,
    Bound,
    StatisticsError,
    betting,
    bound,
    hoeffding,
    maurer_pontil,
    paired_binary_exact,
)
from invar.stats import bounds as bounds_module


def _seed_differences(seed: int = 0) -> np.ndarray:
    """The seed acceptance: n = 2000, 21 worse, 20 better, the rest tied."""
    d = np.concatenate([np.ones(21), -np.ones(20), np.zeros(1959)])
    return np.random.default_rng(seed).permutation(d)


def test_seed_decision_numbers() -> None:
    d = _seed_differences()
    mp = maurer_pontil(d, -1.0, 1.0, 0.05)
    hf = hoeffding(d, -1.0, 1.0, 0.05)
    ex = bound("paired-binary-exact", d, -1.0, 1.0, 0.05)
    assert mp.estimate == 0.0005
    assert round(mp.upper, 4) == 0.0178
    # At an allowance Maurer–Pontil admits, Hoeffding cannot: it ignores the variance.
    epsilon = 0.02
    assert mp.upper <= epsilon < hf.upper
    assert round(hf.upper, 4) == 0.0552
    # The exact method uses the trinomial structure and is tighter than both.
    assert ex.upper < mp.upper
    assert round(ex.upper, 4) == 0.0074
    assert round(ex.lower, 4) == -0.0064


def test_bound_fields_and_versions() -> None:
    d = _seed_differences()
    for method in METHODS:
        result = bound(method, d, -1.0, 1.0, 0.05)
        assert isinstance(result, Bound)
        assert result.method == method
        assert result.version.startswith(method + "/")
        assert (result.n, result.delta, result.estimate) == (2000, 0.05, 0.0005)
        assert -1.0 <= result.lower <= result.estimate <= result.upper <= 1.0
    assert DEFAULT_BINARY_METHOD in METHODS


def test_dispatch_matches_direct_calls() -> None:
    d = _seed_differences(1)
    assert bound("hoeffding", d, -1, 1, 0.1) == hoeffding(d, -1, 1, 0.1)
    assert bound("maurer-pontil", d, -1, 1, 0.1) == maurer_pontil(d, -1, 1, 0.1)
    assert bound("betting", d, -1, 1, 0.1) == betting(d, -1, 1, 0.1)
    assert bound("paired-binary-exact", d, -1, 1, 0.1) == paired_binary_exact(21, 20, 2000, 0.1)


def test_hoeffding_formula() -> None:
    d = np.tile([0.0, 1.0, 1.0, 0.0, 1.0], 10)
    result = hoeffding(d, 0.0, 1.0, 0.1)
    width = math.sqrt(math.log(10.0) / 100.0)
    assert result.upper == pytest.approx(0.6 + width, abs=4e-15)  # outward by 16u(|mean| + width) + 1 ulp
    assert result.upper >= 0.6 + width
    assert result.lower == pytest.approx(0.6 - width, abs=4e-15)
    assert result.lower <= 0.6 - width


def test_bounds_are_clipped_to_the_declared_range() -> None:
    d = np.ones(5)
    for method in METHODS:
        result = bound(method, d, -1.0, 1.0, 0.05)
        assert result.upper == 1.0
        assert result.lower < 1.0
    tiny = maurer_pontil(np.array([0.2, 0.3]), 0.0, 1.0, 0.05)
    assert (tiny.lower, tiny.upper) == (0.0, 1.0)  # too few units to say more than [a, b]


def test_betting_uses_the_given_order_and_matches_its_kernel() -> None:
    rng = np.random.default_rng(5)
    d = rng.choice([-1.0, 0.0, 1.0], p=[0.05, 0.9, 0.05], size=400)
    forward, backward = betting(d, -1.0, 1.0, 0.05), betting(d[::-1], -1.0, 1.0, 0.05)
    assert forward.estimate == backward.estimate
    assert (forward.lower, forward.upper) != (backward.lower, backward.upper)
    rows = np.stack([d, d[::-1]])
    lower_x, upper_x = bounds_module.betting_limits_rescaled(bounds_module.rescale(rows, -1.0, 1.0), 0.05)
    lower, upper = bounds_module.unscale_limits(lower_x, upper_x, -1.0, 1.0)
    assert (lower[0], upper[0]) == (forward.lower, forward.upper)
    assert (lower[1], upper[1]) == (backward.lower, backward.upper)


def test_betting_handles_fifty_thousand_units() -> None:
    d = np.random.default_rng(2).choice([-1.0, 0.0, 1.0], p=[0.01, 0.98, 0.01], size=50_000)
    result = betting(d, -1.0, 1.0, 0.05)
    assert result.lower < result.estimate < result.upper < 0.005


def test_exact_limits_mirror_and_lie_on_the_grid() -> None:
    forward, mirrored = paired_binary_exact(12, 3, 150, 0.05), paired_binary_exact(3, 12, 150, 0.05)
    assert forward.lower == -mirrored.upper
    assert forward.upper == -mirrored.lower
    for value in (forward.lower, forward.upper):
        assert (value * 2.0**41).is_integer()


def test_exact_limits_move_with_the_counts() -> None:
    base = paired_binary_exact(10, 10, 500, 0.05)
    one_more_worse = paired_binary_exact(11, 10, 500, 0.05)
    assert one_more_worse.upper > base.upper
    assert one_more_worse.lower > base.lower
    assert paired_binary_exact(10, 10, 500, 0.01).upper > base.upper
    assert paired_binary_exact(7, 0, 7, 0.05).upper == 1.0


def test_exact_all_tied_small_n() -> None:
    result = paired_binary_exact(0, 0, 1, 0.05)
    assert result.estimate == 0.0
    assert -1.0 < result.lower < 0.0 < result.upper < 1.0


# --- errors -----------------------------------------------------------------------------------------------------


def _one_line_error(call: object) -> str:
    assert callable(call)
    with pytest.raises(StatisticsError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, InvarError)
    return message


@pytest.mark.parametrize("method", METHODS)
def test_nan_and_infinity_are_errors(method: str) -> None:
    for bad in (math.nan, math.inf, -math.inf):
        d = np.array([0.0, 1.0, bad, 0.0])
        message = _one_line_error(lambda d=d: bound(method, d, -1.0, 1.0, 0.05))
        assert "NaN or infinite" in message


@pytest.mark.parametrize("method", METHODS)
def test_empty_input_is_an_error(method: str) -> None:
    assert "empty" in _one_line_error(lambda: bound(method, np.array([]), -1.0, 1.0, 0.05))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5, math.nan, math.inf])
def test_delta_outside_unit_interval_is_an_error(method: str, delta: float) -> None:
    assert "delta" in _one_line_error(lambda: bound(method, np.zeros(5), -1.0, 1.0, delta))


@pytest.mark.parametrize("method", METHODS)
def test_values_outside_the_declared_range_are_errors(method: str) -> None:
    d = np.array([0.0, 1.0, 1.5, 0.0])
    message = _one_line_error(lambda: bound(method, d, -1.0, 1.0, 0.05))
    assert "outside the declared range" in message
    assert "d[2] = 1.5" in message


def test_other_input_errors() -> None:
    assert "a < b" in _one_line_error(lambda: hoeffding(np.zeros(3), 1.0, 1.0, 0.05))
    assert "1-D" in _one_line_error(lambda: hoeffding(np.zeros((2, 2)), -1.0, 1.0, 0.05))
    assert "at least 2 units" in _one_line_error(lambda: maurer_pontil(np.zeros(1), -1.0, 1.0, 0.05))
    assert "unknown bound method" in _one_line_error(lambda: bound("wald", np.zeros(3), -1.0, 1.0, 0.05))
    assert "{-1, 0, 1}" in _one_line_error(lambda: bound("paired-binary-exact", np.array([0.5]), -1.0, 1.0, 0.05))
    assert "a=-1, b=1" in _one_line_error(lambda: bound("paired-binary-exact", np.zeros(3), -2.0, 2.0, 0.05))
    assert "exceeds n" in _one_line_error(lambda: paired_binary_exact(5, 6, 10, 0.05))
    assert "at least 1" in _one_line_error(lambda: paired_binary_exact(0, 0, 0, 0.05))
    assert "integer" in _one_line_error(lambda: paired_binary_exact(True, 0, 10, 0.05))
    assert "at least 0" in _one_line_error(lambda: paired_binary_exact(-1, 0, 10, 0.05))
    assert "real number" in _one_line_error(lambda: hoeffding(np.zeros(3), -1.0, 1.0, "0.05"))  # type: ignore[arg-type]


# --- properties -------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=60),
    delta=st.floats(1e-6, 0.9),
    lo=st.floats(-10.0, 0.0),
    width=st.floats(1e-3, 10.0),
)
def test_general_bounds_bracket_the_sample_mean(values: list[float], delta: float, lo: float, width: float) -> None:
    hi = lo + width
    d = np.clip(lo + width * np.array(values), lo, hi)
    for function in (hoeffding, maurer_pontil):
        result = function(d, lo, hi, delta)
        assert lo <= result.lower <= result.estimate <= result.upper <= hi
    # Betting may cross at a time before n, so its limits need not bracket the final mean; they stay in range.
    result = betting(d, lo, hi, delta)
    assert lo <= result.lower <= hi
    assert lo <= result.upper <= hi


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_exact_bounds_bracket_the_estimate(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    worse = data.draw(st.integers(0, n))
    better = data.draw(st.integers(0, n - worse))
    result = paired_binary_exact(worse, better, n, 0.05)
    assert -1.0 <= result.lower <= result.estimate <= result.upper <= 1.0


def test_smaller_delta_widens_every_bound() -> None:
    d = _seed_differences(3)
    for method in METHODS:
        loose, strict = bound(method, d, -1.0, 1.0, 0.2), bound(method, d, -1.0, 1.0, 0.01)
        assert strict.lower < loose.lower
        assert strict.upper > loose.upper
