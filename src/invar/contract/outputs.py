"""The parts of a use decision's printed form that recorded and imported decisions share.

A decision names its contract the same way whichever evidence it rests on; `invar.imported.outputs` and the
command outputs build on it.
"""

from __future__ import annotations

from invar.printed import Closed


class DecisionContract(Closed):
    name: str
    sha256: str


class PremiseOutput(Closed):
    statement: str
    party: str
    basis_sha256: str
    reliance: str
    holds: bool
    note: str


__all__ = ["DecisionContract", "PremiseOutput"]
