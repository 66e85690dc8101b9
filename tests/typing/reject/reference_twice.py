"""A reference compared with itself is not a candidate's evidence."""

from collections.abc import Sequence

from invar.evidence import Reference, TaskLoss, paired_loss, recorded_losses
from invar.records import CallRecord


def compare(records: Sequence[CallRecord]) -> TaskLoss:
    reference = recorded_losses(Reference, records, [0, 1])
    return paired_loss(reference, reference)  # reject: Argument 2 to "paired_loss" has incompatible type "Losses[Reference]"; expected "Losses[Candidate]"
