"""A bound method the core does not have."""

import numpy as np

from invar.evidence import task_bound
from invar.stats.bounds import Bound


def upper(d: np.ndarray) -> Bound:
    b: Bound = task_bound("wald", d, -1, 1, 0.05)  # reject: No overload variant of "task_bound" matches argument types
    return b
