"""A bounded-range method with any declared range."""

import numpy as np

from invar.evidence import RangeMethod, task_bound
from invar.stats.bounds import Bound


def upper(d: np.ndarray, method: RangeMethod) -> Bound:
    return task_bound(method, d, 0.0, 2.5, 0.05)
