"""Losses in a declared range are not 0/1 losses: the binary pairing does not take them."""

from invar.evidence import Candidate, RangeLosses, Reference, TaskLoss, paired_loss


def compare(reference: RangeLosses[Reference], candidate: RangeLosses[Candidate]) -> TaskLoss:
    return paired_loss(reference, candidate)  # reject: incompatible type "RangeLosses[
