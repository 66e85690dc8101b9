"""Losses in a declared range are not 0/1 losses: the binary pairing does not take them."""

from invar.contract.admit import TaskLoss
from invar.evidence import Candidate, RangeLosses, Reference, paired_loss


def compare(reference: RangeLosses[Reference], candidate: RangeLosses[Candidate]) -> TaskLoss:
    return paired_loss(reference, candidate)  # reject: incompatible type "RangeLosses[
