"""Numbers that no recorded call produced cannot be decided on."""

import numpy as np

from invar.evidence import TaskLoss, paired_loss


def compare() -> TaskLoss:
    reference = np.array([0, 1, 0])
    candidate = np.array([0, 0, 0])
    return paired_loss(reference, candidate)  # reject: has incompatible type "ndarray[
