"""The core's objective: the k3 KL term is the term itself at any size of ref − current, not float32 rounding."""

from __future__ import annotations

import numpy as np

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
