"""Group advantages, as the core computes them from its own rewards.

Each prompt is sampled G times; a sample's advantage is its reward relative to its own group, so no value model is
needed (GRPO, Shao et al. 2024, "DeepSeekMath", eq. 3, outcome supervision). Two normalisations:

- `mean-std` (GRPO): A_i = (r_i − mean(r)) / (std(r) + ε), with the group's standard deviation taken with
  Bessel's correction (divide by G − 1), the unbiased variance estimate of the group's rewards.
- `mean` (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.1): A_i = r_i − mean(r). Dividing
  by the std weights prompts that are nearly always right or nearly always wrong more than the others ("question-
  level difficulty bias"); Dr. GRPO drops the division.

A group whose rewards are all equal carries no signal about which response is better: its advantages are set to
exactly 0 (not left to floating-point cancellation) and the group is counted, so the history can say how much of a
cycle's batch taught nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Normalization = Literal["mean-std", "mean"]


@dataclass(frozen=True)
class GroupAdvantages:
    """The advantages of one cycle's batch and what the groups held."""

    values: np.ndarray
    """float32 [B]: one advantage per sample, in the batch's order (the G samples of a prompt contiguous)."""
    groups: int
    """Number of prompts (B / G)."""
    zero_variance: int
    """Groups whose rewards were all equal (their advantages are exactly 0)."""


def group_advantages(rewards: np.ndarray, group_size: int, normalization: Normalization = "mean-std",
                     eps: float = 1e-6) -> GroupAdvantages:
    """Advantages of a batch of B = prompts × `group_size` rewards, each relative to its prompt's group.

    rewards: float [B], samples of one prompt contiguous. Computed in float64, returned as float32.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if group_size < 2 or r.ndim != 1 or r.shape[0] == 0 or r.shape[0] % group_size:
        raise ValueError(f"{r.shape} rewards do not split into groups of {group_size} (G must be at least 2)")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    g = r.reshape(-1, group_size)
    constant = np.all(g == g[:, :1], axis=1)
    adv = g - g.mean(axis=1, keepdims=True)
    if normalization == "mean-std":
        adv = adv / (g.std(axis=1, ddof=1, keepdims=True) + eps)
    elif normalization != "mean":
        raise ValueError(f"unknown advantage normalization {normalization!r}; use mean-std or mean")
    adv[constant] = 0.0
    return GroupAdvantages(adv.reshape(-1).astype(np.float32), int(g.shape[0]), int(np.sum(constant)))
