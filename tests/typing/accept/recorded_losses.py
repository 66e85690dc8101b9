"""Losses built from answered records, each package's in its own slot, make the paired comparison."""

from collections.abc import Sequence

from invar.evidence import Candidate, Reference, TaskLoss, paired_loss, recorded_losses
from invar.records import CallRecord


def compare(ref_records: Sequence[CallRecord], cand_records: Sequence[CallRecord]) -> TaskLoss:
    reference = recorded_losses(Reference, ref_records, [0, 1, 0])
    candidate = recorded_losses(Candidate, cand_records, [0, 1, 1])
    return paired_loss(reference, candidate)
