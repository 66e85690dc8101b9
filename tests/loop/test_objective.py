"""The core's objective: the k3 KL term is the term itself at any size of ref − current, not float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from invar.loop.objective import ObjectiveSettings, k3, loss_terms


def test_the_k3_term_of_a_tiny_difference_is_the_term_not_rounding() -> None:
    # |d| ~ 1e-5, k3 ≈ d²/2 ≈ 5e-11: written exp(d) − d − 1 in float32 this was rounding of 1 (ulp 1.2e-7), of
    # either sign (a run's learner reported −7.7e-10 where the core had 7.2e-9).
    rng = np.random.default_rng(0)
    current = [(-rng.uniform(0.1, 3.0, 6)).astype(np.float32) for _ in range(4)]
    reference = [(c + rng.uniform(-2e-5, 2e-5, c.shape)).astype(np.float32) for c in current]
    advantages = np.array([1.0, -1.0, 0.5, -0.5], dtype=np.float32)
    terms = loss_terms(current, current, advantages, ObjectiveSettings(kl_coef=0.1), reference=reference)
    d64 = [(r - c).astype(np.float64) for r, c in zip(reference, current, strict=True)]
    exact = sum(float(np.sum(np.expm1(d) - d)) for d in d64) / terms.tokens
    assert 0 < exact < 1e-9
    assert abs(terms.kl - exact) <= 0.02 * exact
    assert abs(terms.loss - (terms.policy + 0.1 * exact)) <= 0.02 * 0.1 * exact


def test_the_k3_term_is_never_negative_and_agrees_with_float64_at_every_scale() -> None:
    d = np.concatenate([np.float32(s) * np.linspace(-1, 1, 201, dtype=np.float32)
                        for s in (1e-6, 1e-5, 1e-3, 0.1, 1.0, 5.0)])
    got = k3(d)
    assert got.dtype == np.float32
    assert np.all(got >= 0)
    d64 = d.astype(np.float64)
    exact = np.expm1(d64) - d64
    # float32 rounding of terms of size |d| (not of size 1): within a few ulp of max(|d|, |expm1 d|).
    assert np.all(np.abs(got - exact) <= 4 * 2.0**-24 * np.maximum(np.abs(d64), np.abs(np.expm1(d64))) + 1e-45)


def _readings(rng: np.random.Generator, sizes: np.ndarray, scale: float,
              base: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """float32 log-probabilities ≤ 0, one array of sizes[i] per sample; near `base` (by about `scale`) if given."""
    out = []
    for i, n in enumerate(sizes):
        x = -rng.exponential(1.0, int(n) + 1).astype(np.float32)
        if base is not None:
            x[1:] = np.minimum(base[i] + (rng.standard_normal(int(n)) * scale).astype(np.float32), 0)
        out.append(x[1:])  # a view one float32 in, as a decoded array may be
    return out


def test_the_batched_objective_is_the_per_sample_one_bit_for_bit() -> None:
    # loss_terms computes the whole batch at once; its definition is the sample-by-sample form (each sample's sum in
    # float64 by numpy, the sums added in order): every term must have the same bits, over batches of every shape,
    # each importance handling, with and without a reference and a current reading, unaligned views included.
    from invar.loop.objective import _loss_terms_per_sample

    rng = np.random.default_rng(7)
    handlings = [ObjectiveSettings(), ObjectiveSettings(importance="truncate", importance_cap=2.0),
                 ObjectiveSettings(importance="mask", importance_cap=1.5, kl_coef=0.05),
                 ObjectiveSettings(clip_low=0.1, clip_high=0.1, kl_coef=0.3)]
    checked = 0
    for trial in range(300):
        b = int(rng.integers(1, 40))
        top = int(rng.choice([1, 5, 9, 130, 300, 9000]))
        sizes = rng.integers(1, top + 1, size=b)
        scale = 10.0 ** rng.uniform(-6, 0.5)
        behavior = _readings(rng, sizes, scale)
        proximal = _readings(rng, sizes, scale, behavior)
        if trial % 5 == 0:  # bit-equal readings, as a learner matching its engine gives
            proximal = [x.copy() for x in behavior]
        current = _readings(rng, sizes, scale, proximal) if trial % 3 == 0 else None
        reference = _readings(rng, sizes, scale, proximal) if trial % 2 == 0 else None
        advantages = rng.standard_normal(b).astype(np.float32 if trial % 4 else np.float64)
        settings = handlings[trial % len(handlings)]
        got = loss_terms(proximal, behavior, advantages, settings, reference=reference, current=current)
        want = _loss_terms_per_sample(proximal, behavior, advantages, settings, reference,
                                      proximal if current is None else current)
        for name in ("loss", "policy", "kl", "importance_weight_mean"):
            assert np.float64(getattr(got, name)).tobytes() == np.float64(getattr(want, name)).tobytes(), \
                (trial, name)
        assert got.tokens == want.tokens == int(sizes.sum())
        checked += 1
    assert checked == 300


def test_the_objective_names_the_sample_whose_readings_differ_in_length() -> None:
    p = [np.full(3, -0.5, np.float32), np.full(4, -0.5, np.float32)]
    b = [np.full(3, -0.5, np.float32), np.full(5, -0.5, np.float32)]
    with pytest.raises(ValueError, match=r"^sample 1: log-probability arrays differ in length$"):
        loss_terms(p, b, np.zeros(2, np.float32), ObjectiveSettings())
