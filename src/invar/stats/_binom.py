"""Binomial pmf, cdf, sf and quantile, and the beta inverse survival function: the numbers of `scipy.stats.binom`
and `scipy.stats.beta.isf`, bit for bit, without importing `scipy.stats`.

Why: `scipy.stats` takes most of a second to import, which every command would pay at start-up, and its
distribution wrappers cost tens of microseconds per call in the proofs' inner loops. Its binomial methods are the
Boost routines that `scipy.special` exposes as ufuncs, wrapped in argument checks; this module applies the same
checks and the same clipping around the same ufuncs (the tests compare against `scipy.stats` on every edge case).
Where an older SciPy lacks those ufuncs, `scipy.stats` itself is used (imported on first call).
"""

from __future__ import annotations

import _imp
import functools
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Ufunc = Callable[..., Any]

_SPECIAL = "scipy.special"
_UFUNCS = "scipy.special._ufuncs"


@functools.cache
def _ufuncs_module() -> Any:
    """SciPy's compiled special-function ufuncs (`scipy.special._ufuncs`), without running `scipy.special`'s
    package `__init__` where nothing has imported it yet.

    Why: that `__init__` builds SciPy's array-API layer, which clones numpy's namespace and so imports numpy's lazy
    submodules (testing, f2py, unittest, ...): 0.3-0.5 s alone, against about 0.1 s for `scipy` and the compiled
    modules (a plan or an admission measured 0.1-0.16 s faster, docs/performance.md). The extension is loaded from
    `scipy.special`'s folder under a bare stand-in for the package; then the stand-in and every module loaded under
    it leave `sys.modules`, so a later `import scipy.special` runs in full as if nothing had happened, and gets this
    very module object back (Cython returns a module it has made already). So the ufuncs are the same objects either
    way: the same Boost code, the same bits. Anything unexpected falls back to the plain import. (Two threads' first
    calls may both load it: the second gets the same module object.)"""
    # The interpreter's import lock (re-entrant) is held while the stand-in is in `sys.modules`, so that no other
    # thread's import of `scipy.special` can meet it.
    _imp.acquire_lock()
    try:
        if _SPECIAL not in sys.modules:
            return _load_under_stand_in()
    except Exception:  # any surprise in SciPy's layout: the plain import below
        pass
    finally:
        _imp.release_lock()
    from scipy.special import _ufuncs

    return _ufuncs


def _load_under_stand_in() -> Any:
    before = set(sys.modules)
    try:
        package = importlib.util.find_spec(_SPECIAL)  # imports `scipy` itself, not `scipy.special`
        where = list(package.submodule_search_locations or []) if package is not None else []
        spec = importlib.machinery.PathFinder.find_spec(_UFUNCS, where) if where else None
        if spec is None or spec.loader is None:
            raise ImportError(_UFUNCS)
        stand_in = types.ModuleType(_SPECIAL)
        stand_in.__path__ = where
        sys.modules[_SPECIAL] = stand_in
        module = importlib.util.module_from_spec(spec)
        sys.modules[_UFUNCS] = module
        spec.loader.exec_module(module)
        return module
    finally:
        for name in set(sys.modules) - before:
            if name == _SPECIAL or name.startswith(_SPECIAL + "."):
                del sys.modules[name]


@functools.cache
def _ufuncs() -> tuple[Ufunc, Ufunc, Ufunc, Ufunc] | None:
    """The ufuncs, loaded on first use (`_ufuncs_module`)."""
    try:
        u = _ufuncs_module()  # private: the Boost binomial routines behind scipy.stats.binom
    except ImportError:  # pragma: no cover - depends on the SciPy version
        return None
    names = ("_binom_pmf", "_binom_cdf", "_binom_sf", "_binom_ppf")
    if not all(hasattr(u, name) for name in names):  # pragma: no cover
        return None
    pmf_, cdf_, sf_, ppf_ = (getattr(u, name) for name in names)
    return pmf_, cdf_, sf_, ppf_


def load() -> None:
    """Import the ufuncs now rather than at first use: in a process about to fork workers that will all use them,
    so that the import is paid once here, not once in each worker and again here."""
    _ufuncs()


def _betainccinv() -> Ufunc:
    inverse: Ufunc = _ufuncs_module().betainccinv  # the object `scipy.special.betainccinv` names
    return inverse


def _scipy_binom() -> Any:  # pragma: no cover - only on a SciPy without the ufuncs
    from scipy import stats

    return stats.binom


def _valid(n: np.ndarray, p: np.ndarray) -> np.ndarray:
    """`binom._argcheck`: n a non-negative integer, p in [0, 1]."""
    valid: np.ndarray = (n >= 0) & (np.floor(n) == n) & (p >= 0) & (p <= 1)
    return valid


def _finish(output: np.ndarray) -> Any:
    return output[()] if output.ndim == 0 else output


def pmf(k: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`scipy.stats.binom.pmf(k, n, p)`."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return _scipy_binom().pmf(k, n, p)
    kk, nn, pp = np.broadcast_arrays(np.asarray(k), np.asarray(n), np.asarray(p))
    good = _valid(nn, pp)
    cond = good & (kk >= 0) & (kk <= nn) & (np.floor(kk) == kk)
    output = np.zeros(cond.shape, "d")
    np.place(output, ~good | np.isnan(kk), np.nan)
    if np.any(cond):
        np.place(output, cond, np.clip(boost[0](kk[cond], nn[cond], pp[cond]), 0, 1))
    return _finish(output)


def cdf(k: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`scipy.stats.binom.cdf(k, n, p)`."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return _scipy_binom().cdf(k, n, p)
    kk, nn, pp = np.broadcast_arrays(np.asarray(k), np.asarray(n), np.asarray(p))
    return _tail(kk, nn, pp, boost[1], kk >= nn)


def sf(k: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`scipy.stats.binom.sf(k, n, p)`."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return _scipy_binom().sf(k, n, p)
    kk, nn, pp = np.broadcast_arrays(np.asarray(k), np.asarray(n), np.asarray(p))
    return _tail(kk, nn, pp, boost[2], (kk < 0) | np.isneginf(kk))


def _tail(kk: np.ndarray, nn: np.ndarray, pp: np.ndarray, boost: Any, saturated: np.ndarray) -> Any:
    """A tail as scipy's `rv_discrete` gives it: NaN for invalid arguments, 1 where the tail holds everything
    (`saturated`), Boost's value at the integer part of k inside the support."""
    good = _valid(nn, pp)
    cond = good & (kk >= 0) & (kk < nn) & np.isfinite(kk)
    output = np.zeros(cond.shape, "d")
    np.place(output, ~good | np.isnan(kk), np.nan)
    np.place(output, saturated & good, 1.0)
    if np.any(cond):
        np.place(output, cond, np.clip(boost(np.floor(kk[cond]), nn[cond], pp[cond]), 0, 1))
    return _finish(output)


def ppf(q: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`scipy.stats.binom.ppf(q, n, p)` (as floats: −1 at q = 0, n at q = 1)."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return _scipy_binom().ppf(q, n, p)
    qq, nn, pp = np.broadcast_arrays(np.asarray(q), np.asarray(n), np.asarray(p))
    good = _valid(nn, pp)
    cond = good & (qq > 0) & (qq < 1)
    output = np.full(cond.shape, np.nan, dtype="d")
    np.place(output, (qq == 0) & good, -1.0)
    top = (qq == 1) & good
    np.place(output, top, nn[top])
    if np.any(cond):
        np.place(output, cond, boost[3](qq[cond], nn[cond], pp[cond]) + 0)
    return _finish(output)


def pmf_inside(k: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`pmf(k, n, p)` where the caller knows every k is an integer in [0, n], n a non-negative integer and p in
    [0, 1]: the same numbers without the checks (which cost more than the pmf itself in small, frequent calls)."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return pmf(k, n, p)
    return np.clip(boost[0](k, n, p), 0, 1)


def cdf_inside(k: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`cdf(k, n, p)` where the caller knows every k is an integer in [0, n), n a non-negative integer and p in
    [0, 1] (as `pmf_inside`)."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return cdf(k, n, p)
    return np.clip(boost[1](k, n, p), 0, 1)


def sf_inside(k: npt.ArrayLike, n: npt.ArrayLike, p: npt.ArrayLike) -> Any:
    """`sf(k, n, p)` where the caller knows every k is an integer in [0, n), n a non-negative integer and p in
    [0, 1] (as `pmf_inside`)."""
    boost = _ufuncs()
    if boost is None:  # pragma: no cover
        return sf(k, n, p)
    return np.clip(boost[2](k, n, p), 0, 1)


def beta_isf(q: npt.ArrayLike, a: npt.ArrayLike, b: npt.ArrayLike) -> Any:
    """`scipy.stats.beta.isf(q, a, b)`: the x with P(Beta(a, b) > x) = q."""
    qq, aa, bb = np.broadcast_arrays(np.asarray(q), np.asarray(a), np.asarray(b))
    good = (aa > 0) & (bb > 0)
    cond = good & (qq > 0) & (qq < 1)
    output = np.full(cond.shape, np.nan)
    np.place(output, good & (qq == 1), 0.0)
    np.place(output, good & (qq == 0), 1.0)
    if np.any(cond):
        np.place(output, cond, _betainccinv()(aa[cond], bb[cond], qq[cond]) * 1.0 + 0.0)
    return _finish(output)
