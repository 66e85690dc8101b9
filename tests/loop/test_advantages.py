"""Group advantages: GRPO's mean/std with Bessel and ε, Dr. GRPO's mean only, zero-variance groups exactly 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from invar.loop.advantages import group_advantages
from invar.loop.objective import group_advantages as objective_group_advantages


def test_mean_std_divides_by_the_bessel_corrected_std_plus_eps() -> None:
    adv = group_advantages(np.array([1.0, 0.0, 0.0, 0.0]), 4, "mean-std", eps=1e-6)
    # mean 0.25; Bessel variance (0.5625 + 3·0.0625) / 3 = 0.25, std 0.5
    assert adv.values.tolist() == pytest.approx([0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)] + [-0.25 / 0.500001] * 2)
    assert adv.values.dtype == np.float32


def test_mean_only_is_dr_grpo() -> None:
    adv = group_advantages(np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), 3, "mean")
    assert adv.values.tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 2 / 3, -1 / 3, -1 / 3])


@pytest.mark.parametrize("normalization", ["mean-std", "mean"])
def test_zero_variance_groups_get_exactly_zero_and_are_counted(normalization: str) -> None:
    rewards = np.array([0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, 3, normalization)  # type: ignore[arg-type]
    assert adv.values[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv.values[6:].tolist() == [0.0, 0.0, 0.0]
    assert (adv.groups, adv.zero_variance) == (3, 2)
    assert all(math.isfinite(v) for v in adv.values)


@pytest.mark.parametrize(("rewards", "group"), [(np.zeros(5), 2), (np.zeros(4), 1), (np.array([np.nan, 0.0]), 2)])
def test_rewards_that_do_not_form_groups_are_refused(rewards: np.ndarray, group: int) -> None:
    with pytest.raises(ValueError, match=r"groups|finite"):
        group_advantages(rewards, group)


def test_the_objective_module_keeps_its_mean_only_form() -> None:
    rewards = np.array([1.0, 0.0, 0.0, 1.0])
    assert objective_group_advantages(rewards, 2).tolist() == [0.5, -0.5, -0.5, 0.5]
