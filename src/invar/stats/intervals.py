"""Confidence intervals for a proportion: the accuracy an evaluation or a training history reports.

Decision: the interval is Clopper–Pearson (exact binomial, two-sided). It never undercovers, which suits a number
people compare across engines and across cycles; it is a little wider than Wilson's. It lives in `stats`, beside
the admission bounds, as a pure function of the counts: both `invar.runner.evaluate` and `invar.loop.history` report
it, and neither may import the other for it.
"""

from __future__ import annotations


def clopper_pearson(correct: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided exact binomial interval for a proportion: `correct` successes of `n` trials, at `confidence`.

    Returns (lower, upper) in [0, 1]; lower is 0 when correct = 0 and upper is 1 when correct = n.
    """
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"need 0 ≤ correct ≤ n and n ≥ 1, got correct={correct}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    from scipy import stats  # here, not at import: scipy.stats costs most of a second of every command's start-up

    alpha = 1.0 - confidence
    lower = 0.0 if correct == 0 else float(stats.beta.ppf(alpha / 2, correct, n - correct + 1))
    upper = 1.0 if correct == n else float(stats.beta.ppf(1 - alpha / 2, correct + 1, n - correct))
    return lower, upper
