"""Losses in a declared range, built from answered records, each package's in its own slot, make their own paired
comparison, whose exact mean is compared with the contract's ε."""

from collections.abc import Sequence

from invar.contract.model import Contract
from invar.evidence import Candidate, RangeTaskLoss, Reference, paired_range_loss, recorded_range_losses, within_epsilon
from invar.records import CallRecord


def compare(ref_records: Sequence[CallRecord], cand_records: Sequence[CallRecord]) -> RangeTaskLoss:
    reference = recorded_range_losses(Reference, ref_records, [0.0, 0.5, 0.25], (0.0, 1.0))
    candidate = recorded_range_losses(Candidate, cand_records, [0.1, 0.5, 1.0], (0.0, 1.0))
    return paired_range_loss(reference, candidate)


def admissible(contract: Contract, loss: RangeTaskLoss) -> bool:
    return within_epsilon(loss.mean_difference, contract.requirement.epsilon)
