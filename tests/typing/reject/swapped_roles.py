"""The reference's evidence cannot be used as the candidate's (nor the other way round)."""

from invar.evidence import Candidate, Losses, Reference, TaskLoss, paired_loss


def compare(reference: Losses[Reference], candidate: Losses[Candidate]) -> TaskLoss:
    return paired_loss(candidate, reference)  # reject: incompatible type "Losses[
