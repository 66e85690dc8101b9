"""0/1 losses are not losses in a declared range: the range pairing does not take them."""

from invar.evidence import Candidate, Losses, RangeTaskLoss, Reference, paired_range_loss


def compare(reference: Losses[Reference], candidate: Losses[Candidate]) -> RangeTaskLoss:
    return paired_range_loss(reference, candidate)  # reject: incompatible type "Losses[
