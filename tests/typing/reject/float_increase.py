"""A rounded mean loss increase is not compared with ε: the exact fraction is."""

from invar.contract.model import Contract
from invar.evidence import TaskLoss, within_epsilon


def admissible(contract: Contract, loss: TaskLoss) -> bool:
    return within_epsilon(float(loss.mean_difference), contract.requirement.epsilon)  # reject: Argument 1 to "within_epsilon" has incompatible type "float"; expected "Fraction"
