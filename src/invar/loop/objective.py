"""The training objective, as the core recomputes it from the records.

One update of a cycle minimises, over the sampled tokens of the batch, a clipped surrogate with a decoupled
importance weight (the behaviour policy is the engine's, the proximal policy is the learner's reading of the same
tokens with the weights the update starts from):

    w_t   = exp(proximal_t − behavior_t)                      importance weight, FP32; exactly 1 where equal
    w_t   ← min(w_t, C) (truncate) | 0 if w_t > C (mask) | w_t  importance-weight handling, cap C
    r_t   = exp(current_t − proximal_t)                        policy ratio; its value is 1 at the first step
    s_t   = min(r_t·A, clip(r_t, 1 − clip_low, 1 + clip_high)·A)
    k_t   = expm1(ref_t − current_t) − (ref_t − current_t)     KL estimator (k3) to the reference policy
    loss  = (1/N) Σ_t [ −w_t·s_t + kl_coef·k_t ]               N = number of response tokens in the batch

A is the sample's advantage, given by the core. Truncating the importance weight at C is truncated importance
sampling (Ionides 2008; for the learner–engine mismatch, Yao et al. 2025, "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training"); masking drops the tokens whose weight exceeds C instead. The learner takes
one optimizer step, so the loss it reports is evaluated where current = proximal: r_t = 1, and the core recomputes
the same value from the reported proximal log-probabilities, its own advantages and the engine's behaviour (and
reference) log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from invar.loop import advantages

OBJECTIVE_VERSION = "clipped-decoupled-k3/2"
"""2: adds the importance-weight handling (truncate or mask at a cap); with `none` the values are version 1's."""

IMPORTANCE_HANDLING = ("none", "truncate", "mask")


@dataclass(frozen=True)
class ObjectiveSettings:
    """Settings the core sends the learner with each update."""

    clip_low: float = 0.2
    """Lower clip of the ratio, as 1 − clip_low."""
    clip_high: float = 0.28
    """Upper clip of the ratio, as 1 + clip_high."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimator to the reference policy (0 disables it)."""
    importance: str = "none"
    """`none`, `truncate` (w ← min(w, cap)) or `mask` (w ← 0 where w > cap)."""
    importance_cap: float | None = None
    """The cap of `truncate` and `mask` (> 1); None with `none`."""

    def __post_init__(self) -> None:
        if self.importance not in IMPORTANCE_HANDLING:
            raise ValueError(f"importance must be one of {IMPORTANCE_HANDLING}, got {self.importance!r}")
        if (self.importance == "none") != (self.importance_cap is None):
            raise ValueError("importance_cap is given exactly when importance is truncate or mask")


@dataclass(frozen=True)
class LossTerms:
    """The objective's value and its parts, each a mean over the batch's response tokens."""

    loss: float
    policy: float
    kl: float
    importance_weight_mean: float
    tokens: int


def loss_terms(
    proximal: Sequence[np.ndarray],
    behavior: Sequence[np.ndarray],
    advantages: np.ndarray,
    settings: ObjectiveSettings,
    reference: Sequence[np.ndarray] | None = None,
    current: Sequence[np.ndarray] | None = None,
) -> LossTerms:
    """Evaluate the objective.

    proximal, behavior, reference, current: one float32 array [T_i] per sample (log-probabilities at the rollout
    temperature); advantages: float32 [B]. `current` defaults to `proximal` (the value at the update's first step).
    Computed in float32 per token, summed in float64.
    """
    if len(proximal) != len(behavior) or len(proximal) != len(advantages):
        raise ValueError("proximal, behavior and advantages must have one entry per sample")
    if reference is not None and len(reference) != len(proximal):
        raise ValueError("reference must have one entry per sample")
    current = proximal if current is None else current
    p32 = [np.asarray(x, dtype=np.float32) for x in proximal]
    b32 = [np.asarray(x, dtype=np.float32) for x in behavior]
    c32 = p32 if current is proximal else [np.asarray(x, dtype=np.float32) for x in current]
    lengths = [x.shape for x in p32]
    if any(len(shape) != 1 or shape[0] == 0 for shape in lengths) or [x.shape for x in b32] != lengths \
            or [x.shape for x in c32] != lengths:
        # Empty, multi-dimensional or unequal arrays: the per-sample loop, which names the sample at fault.
        return _loss_terms_per_sample(p32, b32, advantages, settings, reference, c32)
    # The whole batch at once: the same float32 operations on every token as one sample at a time, each sample's sum
    # in float64 as numpy sums one array (pairwise, `np.add.reduceat` per segment), then the samples' sums added in
    # order as Python floats: the same bits as `_loss_terms_per_sample` (tests/loop/test_objective.py).
    sizes = [shape[0] for shape in lengths]
    starts = np.cumsum([0, *sizes[:-1]])
    p_all, b_all = np.concatenate(p32), np.concatenate(b32)
    c_all = p_all if c32 is p32 else np.concatenate(c32)
    a = np.repeat(np.asarray(advantages, dtype=np.float32), sizes)
    lo = np.float32(1.0 - settings.clip_low)
    hi = np.float32(1.0 + settings.clip_high)
    w = handle_importance(np.exp(p_all - b_all), settings)
    r = np.exp(c_all - p_all)
    s = np.minimum(r * a, np.clip(r, lo, hi) * a)
    policy_sum = _sum_in_order(np.add.reduceat((-(w * s)).astype(np.float64), starts))
    w_sum = _sum_in_order(np.add.reduceat(w.astype(np.float64), starts))
    kl_sum = 0.0
    if reference is not None and settings.kl_coef != 0.0:
        r32 = [np.asarray(x, dtype=np.float32) for x in reference]
        if [x.shape for x in r32] != lengths:
            return _loss_terms_per_sample(p32, b32, advantages, settings, reference, c32)
        d = np.concatenate(r32) - c_all
        kl_sum = _sum_in_order(np.add.reduceat(k3(d).astype(np.float64), starts))
    n = int(p_all.shape[0])
    policy = policy_sum / n
    kl = kl_sum / n
    return LossTerms(loss=policy + settings.kl_coef * kl, policy=policy, kl=kl,
                     importance_weight_mean=w_sum / n, tokens=n)


def _sum_in_order(values: np.ndarray) -> float:
    """0.0 + v_0 + v_1 + … in float64, left to right, as a running Python float adds them."""
    total = 0.0
    for v in values.tolist():
        total += v
    return total


def _loss_terms_per_sample(
    proximal: Sequence[np.ndarray],
    behavior: Sequence[np.ndarray],
    advantages: np.ndarray,
    settings: ObjectiveSettings,
    reference: Sequence[np.ndarray] | None,
    current: Sequence[np.ndarray],
) -> LossTerms:
    """`loss_terms` one sample at a time: the definition the batched form reproduces bit for bit, and the form that
    names the sample whose arrays differ in length."""
    policy_sum = 0.0
    kl_sum = 0.0
    w_sum = 0.0
    n = 0
    lo = np.float32(1.0 - settings.clip_low)
    hi = np.float32(1.0 + settings.clip_high)
    for i, (p, b) in enumerate(zip(proximal, behavior, strict=True)):
        p32 = np.asarray(p, dtype=np.float32)
        b32 = np.asarray(b, dtype=np.float32)
        c32 = np.asarray(current[i], dtype=np.float32)
        if p32.shape != b32.shape or c32.shape != p32.shape:
            raise ValueError(f"sample {i}: log-probability arrays differ in length")
        a = np.float32(advantages[i])
        w = handle_importance(np.exp(p32 - b32), settings)
        r = np.exp(c32 - p32)
        s = np.minimum(r * a, np.clip(r, lo, hi) * a)
        policy_sum += float(np.sum(-(w * s), dtype=np.float64))
        w_sum += float(np.sum(w, dtype=np.float64))
        if reference is not None and settings.kl_coef != 0.0:
            d = np.asarray(reference[i], dtype=np.float32) - c32
            kl_sum += float(np.sum(k3(d), dtype=np.float64))
        n += p32.shape[0]
    if n == 0:
        raise ValueError("the batch has no response tokens")
    policy = policy_sum / n
    kl = kl_sum / n
    return LossTerms(loss=policy + settings.kl_coef * kl, policy=policy, kl=kl,
                     importance_weight_mean=w_sum / n, tokens=n)


def k3(d: np.ndarray) -> np.ndarray:
    """The k3 terms exp(d) − d − 1 of float32 d = ref − current, as expm1(d) − d in float32.

    Written as exp(d) − d − 1, the sum is of size 1 before it cancels to about d²/2: at |d| ~ 1e-5 the result is
    float32 rounding of 1 (ulp 1.2e-7), not the term (5e-11), and may be negative. expm1(d) − d cancels only
    between two numbers of size |d|, so the term keeps its sign and, at |d| ~ 1e-5, a relative error of about
    2·2⁻²⁴/|d| (1 %). Every learner computes it the same way."""
    d32 = np.asarray(d, dtype=np.float32)
    return np.expm1(d32) - d32


def handle_importance(w: np.ndarray, settings: ObjectiveSettings) -> np.ndarray:
    """float32 importance weights [T] after the settings' handling: truncated or masked at the cap, or as given."""
    w32 = np.asarray(w, dtype=np.float32)
    if settings.importance == "none" or settings.importance_cap is None:
        return w32
    cap = np.float32(settings.importance_cap)
    if settings.importance == "truncate":
        return np.minimum(w32, cap)
    return np.where(w32 > cap, np.float32(0.0), w32)


def group_advantages(rewards: np.ndarray, group_size: int, *, scale_by_std: bool = False) -> np.ndarray:
    """Advantages relative to each prompt's group of samples (`invar.loop.advantages.group_advantages`).

    rewards: float [B] with B = prompts × group_size, samples of one prompt contiguous. Returns float32 [B]:
    reward minus its group's mean (Dr. GRPO), divided by the group's standard deviation (+1e-6) when
    `scale_by_std` (GRPO).
    """
    return advantages.group_advantages(rewards, group_size, "mean-std" if scale_by_std else "mean").values
