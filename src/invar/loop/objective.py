"""The training objective, as the core recomputes it from the records.

One update of a cycle minimises, over the sampled tokens of the batch, a clipped surrogate with a decoupled
importance weight (the behaviour policy is the engine's, the proximal policy is the learner's reading of the same
tokens with the weights the update starts from):

    w_t   = exp(proximal_t − behavior_t)                      importance weight, FP32; exactly 1 where equal
    r_t   = exp(current_t − proximal_t)                        policy ratio; its value is 1 at the first step
    s_t   = min(r_t·A, clip(r_t, 1 − clip_low, 1 + clip_high)·A)
    k_t   = exp(ref_t − current_t) − (ref_t − current_t) − 1  KL estimator (k3) to the reference policy
    loss  = (1/N) Σ_t [ −w_t·s_t + kl_coef·k_t ]               N = number of response tokens in the batch

A is the sample's advantage, given by the core. The learner takes one optimizer step, so the loss it reports is
evaluated where current = proximal: r_t = 1, and the core recomputes the same value from the reported proximal
log-probabilities, its own advantages and the engine's behaviour (and reference) log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

OBJECTIVE_VERSION = "clipped-decoupled-k3/1"


@dataclass(frozen=True)
class ObjectiveSettings:
    """Settings the core sends the learner with each update."""

    clip_low: float = 0.2
    """Lower clip of the ratio, as 1 − clip_low."""
    clip_high: float = 0.28
    """Upper clip of the ratio, as 1 + clip_high."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimator to the reference policy (0 disables it)."""


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
        w = np.exp(p32 - b32)
        r = np.exp(c32 - p32)
        s = np.minimum(r * a, np.clip(r, lo, hi) * a)
        policy_sum += float(np.sum(-(w * s), dtype=np.float64))
        w_sum += float(np.sum(w, dtype=np.float64))
        if reference is not None and settings.kl_coef != 0.0:
            d = np.asarray(reference[i], dtype=np.float32) - c32
            kl_sum += float(np.sum(np.exp(d) - d - np.float32(1.0), dtype=np.float64))
        n += p32.shape[0]
    if n == 0:
        raise ValueError("the batch has no response tokens")
    policy = policy_sum / n
    kl = kl_sum / n
    return LossTerms(loss=policy + settings.kl_coef * kl, policy=policy, kl=kl,
                     importance_weight_mean=w_sum / n, tokens=n)


def group_advantages(rewards: np.ndarray, group_size: int, *, scale_by_std: bool = False) -> np.ndarray:
    """Advantages relative to each prompt's group of samples.

    rewards: float [B] with B = prompts × group_size, samples of one prompt contiguous. Returns float32 [B]:
    reward minus its group's mean, divided by the group's standard deviation (+1e-6) when `scale_by_std`.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if group_size < 1 or r.shape[0] % group_size:
        raise ValueError(f"{r.shape[0]} rewards do not split into groups of {group_size}")
    g = r.reshape(-1, group_size)
    adv = g - g.mean(axis=1, keepdims=True)
    if scale_by_std:
        adv = adv / (g.std(axis=1, keepdims=True) + 1e-6)
    out: np.ndarray = adv.reshape(-1).astype(np.float32)
    return out
