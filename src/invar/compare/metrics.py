"""Where and how far two implementations part, one sequence at a time: pure functions, numbers in, numbers out.

Every function here takes the arrays a worker reported (token ids int32, log-probabilities float32 in nats, whole
vocabulary captures float32[V]) and computes in float64. Nothing reads a file or a record.

Decisions:
- **Bits before tolerances.** A log-probability is compared by its float32 bit pattern first (identical or not),
  then by its distance in units in the last place (ULP): the number of float32 values between the two, so 1 means
  adjacent floats, whatever their magnitude. |Δ| in nats follows.
- **The shared prefix.** Two responses agree up to their first differing token; past it they condition on different
  text and their log-probabilities are not comparable, so every per-token comparison of sampled runs stops there.
- **KL from the captures, with a bound on what the capture's precision can tell.** A capture holds the float32
  log-softmax of one step. KL is computed in float64 after renormalizing each side (log-softmax is shift-invariant,
  so an error common to all entries, such as a rounded log-sum-exp, cancels exactly). What is left is each entry's own
  rounding: the model used is that each captured entry lies within one ulp, in the capture's dtype, of
  |a_i| + |max_j a_j| of a normalized distribution (a log-softmax computed as (x_i − max) − logsumexp in that dtype
  with correctly rounded operations errs by less). `kl_error_bound` turns that into a bound on how far the KL of the
  distributions the captures stand for can be from the KL computed; below it, the KL is reported as
  indistinguishable from 0. Values derived through more arithmetic (vLLM's log-probabilities at T ≠ 1, recomputed
  by its worker from temperature-1 values) may carry more error than this model allows.
- **Aggregates use llama.cpp's definitions** (`tools/perplexity/perplexity.cpp`, `kl_divergence`), so numbers can be
  set side by side: mean ± sqrt((E[x²] − E[x]²)/(n − 1)) (0 when n ≤ 10), percentiles by linear interpolation on
  the sorted values at fraction·(n − 1), RMS Δp with uncertainty 0.5/RMS · s.e.(Δp²), "same top" p ± sqrt(p(1 −
  p)/(n − 1)). They are computed in float64 where llama.cpp uses float32, and over every entry of the vocabulary,
  where llama.cpp skips base log-probabilities below −16 (a limit of its 16-bit storage).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from invar.compare.outputs import CaptureComparisonOutput, DistributionOutput

PERCENTILES: tuple[float, ...] = (0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.001)
"""The fractions llama.cpp reports (99.9 % … 0.1 %), the median among them."""

_U64 = 2.0**-53
"""Unit roundoff of float64."""


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """float32[n] → int64[n]: the IEEE bits as integers ordered like the floats (+0 and −0 both 0).

    Adjacent floats map to adjacent integers, so differences of these are ULP distances. NaN raises `ValueError`.
    """
    a = np.asarray(values)
    if a.dtype != np.float32:
        raise ValueError(f"ULP distances are defined here for float32 values, got {a.dtype}")
    if np.isnan(a).any():
        raise ValueError("a log-probability is NaN")
    bits = a.view(np.int32).astype(np.int64)
    ordered: np.ndarray = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    return ordered


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32[n], float32[n] → int64[n]: how many float32 steps apart each pair is (0 for identical values)."""
    distance: np.ndarray = np.abs(ordered_bits(a) - ordered_bits(b))
    return distance


def first_divergence(reference: np.ndarray, candidate: np.ndarray) -> int | None:
    """int32[Tr], int32[Tc] → the index of the first differing token, or None when the sequences are equal.

    When one sequence is a proper prefix of the other, they part where the shorter ends: min(Tr, Tc).
    """
    n = min(len(reference), len(candidate))
    differ = np.flatnonzero(np.asarray(reference[:n]) != np.asarray(candidate[:n]))
    if differ.size:
        return int(differ[0])
    return None if len(reference) == len(candidate) else n


@dataclass(frozen=True)
class SequenceComparison:
    """Two sampled responses to one request, compared token by token over the prefix they share."""

    first_divergence: int | None
    """Index of the first differing token; None when the token sequences are equal."""
    shared: int
    """Tokens both responses hold at the same positions before they part (the shared prefix's length)."""
    tokens_identical: bool
    logprobs_identical: bool
    """There is a shared prefix and every log-probability over it has the same float32 bits (False when the
    responses part at their first token: nothing was compared, so nothing was found identical)."""
    identical: bool
    """Tokens, log-probability bits and finish reason all equal: the unit is bit-identical."""
    max_ulp: int
    """Largest ULP distance between the two log-probabilities of one token over the shared prefix (0 if empty)."""
    max_abs_delta: float
    """Largest |candidate − reference| log-probability over the shared prefix, nats."""
    sum_delta: float
    """Σ (candidate − reference) log-probability over the shared prefix, nats (float64 sum)."""


def compare_sequences(ref_tokens: np.ndarray, ref_logprobs: np.ndarray, cand_tokens: np.ndarray,
                      cand_logprobs: np.ndarray, ref_finish: str = "", cand_finish: str = "") -> SequenceComparison:
    """Compare two sampled responses (tokens int32[T], log-probabilities float32[T], nats) to the same request."""
    fd = first_divergence(ref_tokens, cand_tokens)
    shared = len(ref_tokens) if fd is None else fd
    a, b = ref_logprobs[:shared], cand_logprobs[:shared]
    same_bits = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
    ulps = ulp_distance(a, b)
    delta = b.astype(np.float64) - a.astype(np.float64)
    return SequenceComparison(
        first_divergence=fd, shared=shared, tokens_identical=fd is None, logprobs_identical=shared > 0 and same_bits,
        identical=fd is None and same_bits and ref_finish == cand_finish,
        max_ulp=int(ulps.max()) if shared else 0,
        max_abs_delta=float(np.abs(delta).max()) if shared else 0.0,
        sum_delta=float(delta.sum()),
    )


# --- teacher forcing ---------------------------------------------------------------------------------------------


def teacher_forced_deltas(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """float32[T] (the reference's log-probabilities of its own tokens), float32[T] (the candidate's of the same
    tokens, same contexts) → float64[T]: candidate − reference per step, nats."""
    if reference.shape != candidate.shape:
        raise ValueError(f"teacher forcing compares one response: {reference.shape} vs {candidate.shape} steps")
    return candidate.astype(np.float64) - reference.astype(np.float64)


def first_large_step(deltas: np.ndarray, threshold: float) -> int | None:
    """float64[T] → the first step with |Δ| > `threshold` nats, or None."""
    large = np.flatnonzero(np.abs(deltas) > threshold)
    return int(large[0]) if large.size else None


# --- full-vocabulary captures ---------------------------------------------------------------------------------


def _check_capture(values: np.ndarray, what: str) -> None:
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{what}: a capture is one non-empty vector over the vocabulary, got shape {values.shape}")
    if np.isnan(values).any() or np.isposinf(values).any():
        raise ValueError(f"{what}: a capture holds NaN or +inf, which no log-probability is")
    if np.isneginf(values).all():
        raise ValueError(f"{what}: every entry of the capture is −inf (no token has probability)")


def normalized(log_probs: np.ndarray) -> np.ndarray:
    """float[V] log-probabilities → float64[V] shifted so that Σ exp = 1 (log-sum-exp taken in float64)."""
    x = log_probs.astype(np.float64)
    top = float(np.max(x))
    return x - (top + math.log(float(np.exp(x - top).sum())))


def entry_error(log_probs: np.ndarray) -> np.ndarray:
    """float[V] (a capture, in its own dtype) → float64[V]: the per-entry error the KL bound allows (see the module
    docstring): an ulp, in the capture's dtype, of |a_i| + |max_j a_j|, taken at the top of its binade so that the
    rounding of the sum itself cannot lower it."""
    info = np.finfo(log_probs.dtype)
    finite = np.isfinite(log_probs)
    x = np.abs(log_probs.astype(np.float64)) + abs(float(np.max(log_probs)))
    _, exponent = np.frexp(np.where(finite, x, 1.0))  # x < 2**exponent
    err = np.ldexp(1.0, exponent - info.nmant - 1)
    return np.where(finite, np.maximum(err, float(info.smallest_subnormal)), 0.0)


def kl_divergence(p_log: np.ndarray, q_log: np.ndarray) -> float:
    """KL(p ‖ q) in nats, float64, from two log-probability vectors float[V] (each renormalized first).

    Terms where p is 0 contribute 0; a term where p > 0 and q = 0 makes it +inf.
    """
    a, b = normalized(p_log), normalized(q_log)
    p = np.exp(a)
    live = p > 0
    if np.isneginf(b[live]).any():
        return math.inf
    return float(np.sum(p[live] * (a[live] - b[live])))


def _log_sum_exp(x: np.ndarray) -> float:
    top = float(np.max(x))
    return top + math.log(float(np.exp(x - top).sum()))


def kl_error_bound(p_log: np.ndarray, q_log: np.ndarray) -> float:
    """A bound, nats, on |KL(p* ‖ q*) − kl_divergence(p_log, q_log)| for any normalized p*, q* whose entries are
    within `entry_error` of the captures (after a common shift): what the captures' precision leaves open, plus the
    float64 rounding of the computation.

    With â, b̂ the renormalized captures, p̂ = e^â, q̂ = e^b̂, x = â − b̂, e and f the entry errors of the two captures,
    each entry of a* − â is within d = e + log Σ p̂ e^e (the renormalization can move it by that much), each of
    b* − b̂ within g = f + log Σ q̂ e^f. Writing p* = p̂ e^δ, q* = q̂ e^ε,
    KL* − KL̂ = Σ p̂ (e^δ − 1) x + KL(p* ‖ p̂) − KL(q* ‖ q̂) − Σ (p* − q*) ε, and KL ≤ χ² bounds the middle terms:
    |ΔKL| ≤ Σ p̂ (e^d − 1)|x| + Σ p̂ (e^d − 1)² + Σ q̂ (e^g − 1)² + Σ g (|p̂ − q̂| + p̂ (e^d − 1) + q̂ (e^g − 1)).
    Every term but the squares vanishes as the captures approach each other, so near-identical captures get a bound
    of the order of (ulp)², not ulp. The float64 rounding adds 4(n + 4) 2^−53 (1 + |L_p| + |L_q| + Σ p̂ |x|) +
    2^−52 Σ p̂ (|â| + |b̂|)(1 + |x|), with L the two log-sum-exps and n = min(V, 128) + ⌈log₂ V⌉ (numpy's pairwise
    summation). A KL of +inf has an infinite bound.
    """
    a, b = normalized(p_log), normalized(q_log)
    p, q = np.exp(a), np.exp(b)
    live = p > 0
    if np.isneginf(b[live]).any():
        return math.inf
    e, f = entry_error(p_log), entry_error(q_log)
    d = e + math.log(float(np.sum(p * np.exp(e))))
    g = f + math.log(float(np.sum(q * np.exp(f))))
    em_d, em_g = np.expm1(d), np.expm1(g)
    x = np.zeros_like(a)
    x[live] = np.abs(a[live] - b[live])
    capture = (np.sum(p * em_d * x) + np.sum(p * em_d**2) + np.sum(q * em_g**2)
               + np.sum(g * (np.abs(p - q) + p * em_d + q * em_g)))
    v = len(a)
    n = min(v, 128) + math.ceil(math.log2(v)) if v > 1 else 1
    lse_p = abs(_log_sum_exp(p_log.astype(np.float64)))
    lse_q = abs(_log_sum_exp(q_log.astype(np.float64)))
    a_abs = np.where(np.isfinite(a), np.abs(a), 0.0)
    b_abs = np.where(np.isfinite(b), np.abs(b), 0.0)
    rounding = (4 * (n + 4) * _U64 * (1 + lse_p + lse_q + float(np.sum(p * x)))
                + 2 * _U64 * float(np.sum(p * (a_abs + b_abs) * (1 + x))))
    return float((capture + rounding) * (1 + 1e-9))  # the bound's own float64 evaluation, rounded up


@dataclass(frozen=True)
class CaptureComparison:
    """The two full next-token distributions at one step of one response."""

    step: int
    kl_ref_cand: float
    """KL(reference ‖ candidate), nats (llama.cpp's KLD, reference as base)."""
    kl_cand_ref: float
    """KL(candidate ‖ reference), nats."""
    bound_ref_cand: float
    """Numerical error bound of `kl_ref_cand` from the capture's precision (`kl_error_bound`)."""
    bound_cand_ref: float
    same_top: bool
    """The most probable token is the same (first index wins ties)."""
    delta_p: float
    """p_candidate(next token) − p_reference(next token): the token the reference's response holds at this step."""
    identical: bool
    """The two captures have the same bits."""

    @property
    def indistinguishable(self) -> bool:
        """Both KLs are within their numerical error bound of 0."""
        return abs(self.kl_ref_cand) <= self.bound_ref_cand and abs(self.kl_cand_ref) <= self.bound_cand_ref

    def output(self) -> CaptureComparisonOutput:
        """What a unit's row prints of it."""
        return CaptureComparisonOutput(
            step=self.step, kl_ref_cand=self.kl_ref_cand, kl_cand_ref=self.kl_cand_ref,
            bound_ref_cand=self.bound_ref_cand, bound_cand_ref=self.bound_cand_ref,
            indistinguishable_from_0=self.indistinguishable, same_top=self.same_top, delta_p=self.delta_p,
            identical=self.identical)


def compare_capture(step: int, reference: np.ndarray, candidate: np.ndarray, token: int) -> CaptureComparison:
    """Compare two captures float[V] (log-probabilities over the whole vocabulary at one step, same context) and the
    probability each gives `token`, the reference response's token at that step."""
    _check_capture(reference, "reference capture")
    _check_capture(candidate, "candidate capture")
    if reference.shape != candidate.shape:
        raise ValueError(f"the captures cover vocabularies of {reference.size} and {candidate.size} tokens")
    if not 0 <= token < reference.size:
        raise ValueError(f"token {token} is outside the vocabulary of {reference.size}")
    a, b = normalized(reference), normalized(candidate)
    return CaptureComparison(
        step=step,
        kl_ref_cand=kl_divergence(reference, candidate),
        kl_cand_ref=kl_divergence(candidate, reference),
        bound_ref_cand=kl_error_bound(reference, candidate),
        bound_cand_ref=kl_error_bound(candidate, reference),
        same_top=int(np.argmax(reference)) == int(np.argmax(candidate)),
        delta_p=float(math.exp(b[token]) - math.exp(a[token])),
        identical=reference.dtype == candidate.dtype and reference.tobytes() == candidate.tobytes(),
    )


# --- aggregates, as llama.cpp defines them -----------------------------------------------------------------------


def mean_and_uncertainty(values: np.ndarray) -> tuple[float, float]:
    """float[n] → (mean, its standard error sqrt((E[x²] − E[x]²)/(n − 1))); the error is 0 when n ≤ 10 or the
    variance is not positive, as in llama.cpp. (0, 0) for no values."""
    n = len(values)
    if n < 1:
        return 0.0, 0.0
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.sum() / n)
    var = float((x * x).sum() / n - mean * mean)
    return mean, math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """The `fraction` percentile of ascending float[n] by linear interpolation at fraction·(n − 1)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no values")
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = fraction * (n - 1)
    i = int(p)
    p -= i
    return float((1 - p) * sorted_values[i] + p * sorted_values[min(i + 1, n - 1)])


@dataclass(frozen=True)
class Distribution:
    """A sample of values summarized as llama.cpp summarizes its KLD and Δp values."""

    n: int
    mean: float
    stderr: float
    minimum: float
    maximum: float
    percentiles: dict[float, float]
    """fraction → value, for `PERCENTILES`."""

    def output(self) -> DistributionOutput:
        """What a comparison prints of it (percentiles keyed by percent: `50`, `99.9`)."""
        return DistributionOutput(n=self.n, mean=self.mean, stderr=self.stderr, min=self.minimum, max=self.maximum,
                                  percentiles={f"{100 * f:g}": v for f, v in self.percentiles.items()})


def distribution(values: Sequence[float] | np.ndarray) -> Distribution | None:
    """Summary of float[n] (None for n = 0)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    if x.size == 0:
        return None
    mean, err = mean_and_uncertainty(x)
    return Distribution(int(x.size), mean, err, float(x[0]), float(x[-1]),
                        {f: percentile(x, f) for f in PERCENTILES})


def rms_and_uncertainty(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """float[n] → (sqrt(E[x²]), 0.5/RMS · s.e. of x²), llama.cpp's "RMS Δp"."""
    x = np.asarray(values, dtype=np.float64)
    mse, err = mean_and_uncertainty(x * x)
    rms = math.sqrt(mse)
    return rms, (0.5 / rms * err if rms > 0 else 0.0)


def fraction_and_uncertainty(count: int, n: int) -> tuple[float, float]:
    """count of n → (p, sqrt(p(1 − p)/(n − 1))), llama.cpp's "Same top p" (error 0 for n ≤ 1)."""
    if n < 1:
        return 0.0, 0.0
    p = count / n
    return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


__all__ = [
    "PERCENTILES",
    "CaptureComparison",
    "Distribution",
    "SequenceComparison",
    "compare_capture",
    "compare_sequences",
    "distribution",
    "entry_error",
    "first_divergence",
    "first_large_step",
    "fraction_and_uncertainty",
    "kl_divergence",
    "kl_error_bound",
    "mean_and_uncertainty",
    "normalized",
    "ordered_bits",
    "percentile",
    "rms_and_uncertainty",
    "teacher_forced_deltas",
    "ulp_distance",
]
