"""The contract's ε (a Decimal, exactly as written) against the exact mean loss increase (a Fraction)."""

from decimal import Decimal
from fractions import Fraction

from invar.contract.model import Contract
from invar.evidence import TaskLoss, within_epsilon


def admissible(contract: Contract, loss: TaskLoss) -> bool:
    return within_epsilon(loss.mean_difference, contract.requirement.epsilon)


def literal() -> bool:
    return within_epsilon(Fraction(3, 200), Decimal("0.02"))
