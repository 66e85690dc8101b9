"""A float ε is not the contract's exact one."""

from invar.evidence import TaskLoss, within_epsilon


def admissible(loss: TaskLoss) -> bool:
    return within_epsilon(loss.mean_difference, 0.02)  # reject: Argument 2 to "within_epsilon" has incompatible type "float"; expected "Decimal"
