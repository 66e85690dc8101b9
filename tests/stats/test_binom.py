"""`invar.stats._binom` gives the numbers of `scipy.stats` bit for bit (the exact plans and proofs rest on them)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from invar.stats import _binom


def _same(a: object, b: object) -> None:
    x, y = np.asarray(a), np.asarray(b)
    assert x.shape == y.shape
    assert x.dtype == y.dtype
    assert np.array_equal(x, y, equal_nan=True)
    assert type(a) is type(b)


@pytest.mark.parametrize("name", ["pmf", "cdf", "sf"])
def test_binomial_functions_equal_scipy_stats(name: str) -> None:
    rng = np.random.default_rng(5)
    ns = rng.integers(0, 20_000, 4000)
    ps = rng.random(4000) ** 3
    ks = np.floor(ns * ps + rng.normal(0, 3, 4000) * np.sqrt(ns * ps + 1)).astype(np.int64)
    ours, theirs = getattr(_binom, name), getattr(stats.binom, name)
    _same(ours(ks, ns, ps), theirs(ks, ns, ps))
    _same(ours(ks.astype(np.float64) + 0.5, ns, ps), theirs(ks.astype(np.float64) + 0.5, ns, ps))
    # edges: outside the support, p at 0 and 1, n = 0, invalid arguments, infinities, scalars and broadcasting
    k = np.array([-np.inf, -2, -1, 0, 1, 5, 9, 10, 11, np.inf, np.nan])
    for n, p in [(10, 0.0), (10, 1.0), (10, 0.3), (0, 0.5), (-1, 0.5), (10.5, 0.3), (10, -0.1), (10, 1.5)]:
        _same(ours(k, n, p), theirs(k, n, p))
        for one in k.tolist():
            _same(ours(one, n, p), theirs(one, n, p))
    _same(ours(np.arange(12)[None, :], 11, np.linspace(0, 1, 7)[:, None]),
          theirs(np.arange(12)[None, :], 11, np.linspace(0, 1, 7)[:, None]))


def test_binomial_quantile_equals_scipy_stats() -> None:
    rng = np.random.default_rng(6)
    ns = rng.integers(0, 50_000, 4000)
    ps = rng.random(4000) ** 3
    for q in (5e-14, 1 - 5e-14, 0.5):
        _same(_binom.ppf(q, ns, ps), stats.binom.ppf(q, ns, ps))
    qs = np.array([0.0, 1.0, 0.2, -0.1, 1.1, np.nan])
    for n, p in [(10, 0.0), (10, 1.0), (10, 0.3), (0, 0.5), (-1, 0.5)]:
        _same(_binom.ppf(qs, n, p), stats.binom.ppf(qs, n, p))
        _same(_binom.ppf(0.3, n, p), stats.binom.ppf(0.3, n, p))


def test_beta_isf_equals_scipy_stats() -> None:
    rng = np.random.default_rng(7)
    n = rng.integers(1, 30_000, 4000)
    k = np.minimum(rng.integers(0, 400, 4000), n)
    for gamma in (0.001, 0.0005, 0.05):
        _same(_binom.beta_isf(gamma, k + 1, np.maximum(n - k, 1)), stats.beta.isf(gamma, k + 1, np.maximum(n - k, 1)))
        _same(_binom.beta_isf(gamma, 3, 40), stats.beta.isf(gamma, 3, 40))
    qs = np.array([0.0, 1.0, 0.5, -1.0, 2.0, np.nan])
    _same(_binom.beta_isf(qs, 2.0, 3.0), stats.beta.isf(qs, 2.0, 3.0))
    _same(_binom.beta_isf(0.1, 0.0, 3.0), stats.beta.isf(0.1, 0.0, 3.0))


_FRESH = """
import sys
from invar.stats import _binom
import numpy as np
rng = np.random.default_rng(8)
ns = rng.integers(0, 20_000, 2000)
ps = rng.random(2000) ** 3
ks = np.floor(ns * ps + rng.normal(0, 3, 2000) * np.sqrt(ns * ps + 1))
ours = [_binom.pmf(ks, ns, ps), _binom.cdf(ks, ns, ps), _binom.sf(ks, ns, ps), _binom.ppf(0.3, ns, ps),
        _binom.beta_isf(0.001, ks + 1, np.maximum(ns - ks, 1))]
assert "scipy.special" not in sys.modules, "the package's __init__ ran"
import scipy.special
from scipy import stats
theirs = [stats.binom.pmf(ks, ns, ps), stats.binom.cdf(ks, ns, ps), stats.binom.sf(ks, ns, ps),
          stats.binom.ppf(0.3, ns, ps), stats.beta.isf(0.001, ks + 1, np.maximum(ns - ks, 1))]
assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(ours, theirs, strict=True))
assert scipy.special._ufuncs is _binom._ufuncs_module()
assert scipy.special.betainccinv is _binom._betainccinv()
print("same")
"""


def test_a_fresh_process_takes_the_ufuncs_without_scipy_special_init() -> None:
    """A command's first binomial tail loads SciPy's compiled ufuncs without `scipy.special`'s package `__init__`
    (0.3-0.5 s of start-up); the numbers are scipy.stats' all the same, and a later `import scipy.special` in that
    process gets the very same ufunc objects."""
    done = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "same"
