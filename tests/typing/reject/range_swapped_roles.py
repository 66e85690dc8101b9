"""The reference's range losses cannot be used as the candidate's (nor the other way round)."""

from invar.evidence import Candidate, RangeLosses, RangeTaskLoss, Reference, paired_range_loss


def compare(reference: RangeLosses[Reference], candidate: RangeLosses[Candidate]) -> RangeTaskLoss:
    return paired_range_loss(candidate, reference)  # reject: incompatible type "RangeLosses[
