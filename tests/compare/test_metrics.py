"""The pure metrics against independent arithmetic: scipy's rel_entr, exact rationals, llama.cpp's formulas."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.special import log_softmax, rel_entr

from invar.compare.metrics import (
    compare_capture,
    compare_sequences,
    distribution,
    first_divergence,
    first_large_step,
    fraction_and_uncertainty,
    kl_divergence,
    kl_error_bound,
    mean_and_uncertainty,
    percentile,
    rms_and_uncertainty,
    teacher_forced_deltas,
    ulp_distance,
)
from invar.compare.numerical import NumericalComparison, UnitResult


def _capture(rng: np.random.Generator, v: int, scale: float = 4.0) -> np.ndarray:
    """A float32 log-softmax of random logits, as a worker reports one."""
    return log_softmax(rng.normal(0, scale, v).astype(np.float32)).astype(np.float32)


def test_ulp_distance_counts_float32_steps_across_zero() -> None:
    a = np.array([1.0, -1.0, 0.0, -0.0, -2.5], dtype=np.float32)
    b = np.array([np.nextafter(np.float32(1), np.float32(2)), -1.0, -0.0, np.float32(1e-45), -2.5],
                 dtype=np.float32)
    assert ulp_distance(a, b).tolist() == [1, 0, 0, 1, 0]
    x = np.float32(-0.5)
    y = np.float32(x)
    for _ in range(7):
        y = np.nextafter(y, np.float32(0))
    assert ulp_distance(np.array([x]), np.array([y])).tolist() == [7]


def test_first_divergence_is_the_first_differing_token_or_the_end_of_the_shorter() -> None:
    t = np.array([5, 6, 7, 2], dtype=np.int32)
    assert first_divergence(t, t.copy()) is None
    assert first_divergence(t, np.array([5, 9, 7, 2], dtype=np.int32)) == 1
    assert first_divergence(t, t[:2]) == 2
    assert first_divergence(t[:0], t) == 0


def test_sequences_compare_only_over_the_shared_prefix() -> None:
    ref_t = np.array([3, 4, 5, 2], dtype=np.int32)
    cand_t = np.array([3, 4, 9, 2], dtype=np.int32)
    ref_lp = np.array([-0.5, -0.25, -1.0, -0.1], dtype=np.float32)
    cand_lp = np.array([-0.5, np.nextafter(np.float32(-0.25), np.float32(0)), -8.0, -0.1], dtype=np.float32)
    s = compare_sequences(ref_t, ref_lp, cand_t, cand_lp, "stop", "stop")
    assert (s.first_divergence, s.shared, s.tokens_identical, s.logprobs_identical) == (2, 2, False, False)
    assert s.max_ulp == 1
    assert s.sum_delta == float(cand_lp[1]) - float(ref_lp[1])  # step 2 (other tokens) is not counted
    same = compare_sequences(ref_t, ref_lp, ref_t.copy(), ref_lp.copy(), "stop", "stop")
    assert same.identical
    assert (same.max_ulp, same.max_abs_delta, same.sum_delta) == (0, 0.0, 0.0)
    assert not compare_sequences(ref_t, ref_lp, ref_t, ref_lp, "stop", "length").identical


def test_responses_that_part_at_the_first_token_are_not_counted_bit_identical_over_a_prefix() -> None:
    # Nothing is shared, so nothing was compared: "bit-identical over the shared prefix" must not count the unit.
    ref_t, ref_lp = np.array([3, 4], dtype=np.int32), np.array([-0.5, -0.25], dtype=np.float32)
    cand_t, cand_lp = np.array([7, 4], dtype=np.int32), np.array([-2.0, -0.25], dtype=np.float32)
    parted = compare_sequences(ref_t, ref_lp, cand_t, cand_lp, "stop", "stop")
    assert (parted.first_divergence, parted.shared, parted.logprobs_identical) == (0, 0, False)
    same = compare_sequences(ref_t, ref_lp, ref_t.copy(), ref_lp.copy(), "stop", "stop")
    units = tuple(UnitResult(f"u{i}", "1+1=", None, None, (), (), seq, None, None, None, (), None)
                  for i, seq in enumerate((parted, same, parted)))
    generation = NumericalComparison(units, large_step=1.0, context=None).generation()
    assert (generation.logprobs_identical_over_shared_prefix, generation.with_shared_prefix) == (1, 1)
    assert generation.units == 3
    # Where no unit shares a prefix there is nothing to summarise, and the output says so with nulls.
    none_shared = NumericalComparison(units[:1] + units[2:], large_step=1.0, context=None).generation()
    assert none_shared.with_shared_prefix == 0
    assert none_shared.max_ulp is none_shared.max_abs_delta is none_shared.sum_delta is None
    assert none_shared.model_dump(exclude_unset=True)["max_ulp"] is None  # printed as null, not left out


def test_teacher_forced_deltas_of_an_engine_against_itself_are_exactly_zero() -> None:
    lp = _capture(np.random.default_rng(1), 9)
    d = teacher_forced_deltas(lp, lp.copy())
    assert d.dtype == np.float64
    assert not d.any()
    assert first_large_step(d, 1e-12) is None
    moved = lp.copy()
    moved[4] -= np.float32(0.5)
    assert first_large_step(teacher_forced_deltas(lp, moved), 0.01) == 4


def test_identical_captures_give_kl_exactly_zero_and_every_flag_identical() -> None:
    rng = np.random.default_rng(2)
    for v in (2, 18, 1000):
        cap = _capture(rng, v)
        c = compare_capture(0, cap, cap.copy(), int(rng.integers(v)))
        assert (c.kl_ref_cand, c.kl_cand_ref, c.delta_p) == (0.0, 0.0, 0.0)
        assert c.identical
        assert c.same_top
        assert c.indistinguishable


@pytest.mark.parametrize("v", [18, 4096])
def test_a_known_perturbation_gives_scipys_kl(v: int) -> None:
    rng = np.random.default_rng(v)
    p_log = _capture(rng, v)
    q_log = log_softmax(p_log.astype(np.float64) + rng.normal(0, 0.3, v)).astype(np.float32)
    p = np.exp(p_log.astype(np.float64))
    q = np.exp(q_log.astype(np.float64))
    expected_pq = float(np.sum(rel_entr(p / p.sum(), q / q.sum())))
    expected_qp = float(np.sum(rel_entr(q / q.sum(), p / p.sum())))
    c = compare_capture(3, p_log, q_log, 0)
    assert c.kl_ref_cand == pytest.approx(expected_pq, rel=1e-9, abs=1e-15)
    assert c.kl_cand_ref == pytest.approx(expected_qp, rel=1e-9, abs=1e-15)
    assert c.kl_ref_cand > c.bound_ref_cand  # a real difference is not "indistinguishable"
    assert c.same_top == (int(np.argmax(p_log)) == int(np.argmax(q_log)))
    assert c.delta_p == pytest.approx(q[0] / q.sum() - p[0] / p.sum(), abs=1e-15)


def test_top_one_ties_go_to_the_first_index() -> None:
    a = np.log(np.array([0.4, 0.4, 0.2], dtype=np.float32))
    b = np.log(np.array([0.3, 0.4, 0.3], dtype=np.float32))
    assert not compare_capture(0, a, b, 0).same_top  # argmax a = 0 (first of the tie), argmax b = 1


def test_kl_with_zero_probability_where_the_base_has_mass_is_infinite() -> None:
    p = np.array([-0.5, -1.0, -3.0], dtype=np.float32)
    q = np.array([0.0, -np.inf, -np.inf], dtype=np.float32)
    assert kl_divergence(p, q) == math.inf
    assert math.isfinite(kl_divergence(q, p))


def _exact_kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL in float64 of two float64 distributions given as probabilities (the 'true' ones)."""
    return float(np.sum(rel_entr(p, q)))


def test_the_bound_covers_what_float32_rounding_of_the_captures_hides() -> None:
    """Distributions known in float64, captured as float32 log-softmax: the KL computed from the captures stays
    within the bound of the KL of the distributions themselves; and captures that differ only by that rounding are
    reported as indistinguishable from 0."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        v = int(rng.choice([3, 18, 200]))
        scale = float(rng.choice([0.5, 3.0, 12.0]))
        logits_p = rng.normal(0, scale, v)
        logits_q = logits_p + rng.normal(0, float(rng.choice([0.0, 1e-7, 1e-3, 0.3])), v)
        lp, lq = log_softmax(logits_p), log_softmax(logits_q)
        cap_p, cap_q = lp.astype(np.float32), lq.astype(np.float32)
        true = _exact_kl(np.exp(lp), np.exp(lq))
        computed = kl_divergence(cap_p, cap_q)
        bound = kl_error_bound(cap_p, cap_q)
        assert abs(computed - true) <= bound, (trial, computed, true, bound)
    # Captures computed the way engines do, in float32 arithmetic ((x − max) − log Σ exp(x − max)), against the
    # exact distributions of the same float32 logits.
    for trial in range(200):
        v = int(rng.choice([18, 1000]))
        logits_p = rng.normal(0, float(rng.choice([1.0, 6.0])), v).astype(np.float32)
        logits_q = (logits_p + rng.normal(0, float(rng.choice([0.0, 1e-6, 0.05])), v)).astype(np.float32)

        def f32_log_softmax(z: np.ndarray) -> np.ndarray:
            shifted = z - np.max(z)
            return (shifted - np.log(np.sum(np.exp(shifted), dtype=np.float32))).astype(np.float32)

        true = _exact_kl(np.exp(log_softmax(logits_p.astype(np.float64))),
                         np.exp(log_softmax(logits_q.astype(np.float64))))
        cap_p, cap_q = f32_log_softmax(logits_p), f32_log_softmax(logits_q)
        assert abs(kl_divergence(cap_p, cap_q) - true) <= kl_error_bound(cap_p, cap_q), trial
    # Same float64 distribution, captured through two float32 roundings of slightly different (1 ulp) logits.
    logits = rng.normal(0, 3.0, 18)
    a = log_softmax(logits.astype(np.float32))
    b = log_softmax(np.nextafter(logits.astype(np.float32), np.float32(np.inf)))
    c = compare_capture(0, a.astype(np.float32), b.astype(np.float32), 0)
    assert c.indistinguishable


def test_mean_and_uncertainty_follow_llama_cpp() -> None:
    x = np.arange(1.0, 21.0)  # n = 20 > 10
    mean, err = mean_and_uncertainty(x)
    n = Fraction(20)
    m = Fraction(sum(range(1, 21)), 20)
    var = Fraction(sum(i * i for i in range(1, 21)), 20) - m * m
    assert mean == float(m)
    assert err == pytest.approx(math.sqrt(var / (n - 1)), rel=1e-15)
    assert mean_and_uncertainty(np.arange(10.0))[1] == 0.0  # n ≤ 10: no uncertainty, as llama.cpp
    assert mean_and_uncertainty(np.array([]))[0] == 0.0


def test_percentiles_interpolate_linearly_at_fraction_times_n_minus_one() -> None:
    x = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    assert percentile(x, 0.5) == 20.0
    assert percentile(x, 0.9) == pytest.approx(36.0)  # p = 3.6 → 30 + 0.6·10
    assert percentile(x, 0.001) == pytest.approx(0.04)
    assert (percentile(x, 0.0), percentile(x, 1.0)) == (0.0, 40.0)
    d = distribution([3.0, 1.0, 2.0])
    assert d is not None
    assert (d.minimum, d.maximum, d.percentiles[0.5]) == (1.0, 3.0, 2.0)


def test_rms_and_same_top_uncertainties_follow_llama_cpp() -> None:
    dp = np.linspace(-0.2, 0.3, 25)
    rms, err = rms_and_uncertainty(dp)
    mse, mse_err = mean_and_uncertainty(dp * dp)
    assert rms == math.sqrt(mse)
    assert err == pytest.approx(0.5 / rms * mse_err)
    p, e = fraction_and_uncertainty(90, 100)
    assert (p, e) == (0.9, pytest.approx(math.sqrt(0.9 * 0.1 / 99)))
