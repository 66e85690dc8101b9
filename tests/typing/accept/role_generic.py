"""Code that reads either package's losses says so with the role variable, and keeps the role it was given."""

from invar.evidence import Candidate, Losses, Reference, RoleT


def units(losses: Losses[RoleT]) -> int:
    return int(losses.values.size)


def same(losses: Losses[RoleT]) -> Losses[RoleT]:
    return losses


def both(reference: Losses[Reference], candidate: Losses[Candidate]) -> tuple[Losses[Reference], int]:
    return same(reference), units(reference) + units(candidate)
