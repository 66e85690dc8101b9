"""Imported evidence: deciding from the per-item scores lm-evaluation-harness, Inspect AI or a plain table
exported, with the same rules as a recorded decision, and saying in its premises that the scores are the
exporter's word (`invar.imported.decide`).

The names below are imported when first used: `use plan` asks only whether a contract is imported
(`invar.imported.model`), and the decision's modules (the binding, the bounds, the comparison) cost it a third of a
second of start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from invar.lazy import facade

if TYPE_CHECKING:
    from invar.imported.decide import ImportedDecision, admit_imported, prepare_imported
    from invar.imported.model import is_imported_contract, is_imported_declaration

_EXPORTS: dict[str, str] = {
    "ImportedDecision": "invar.imported.decide",
    "admit_imported": "invar.imported.decide",
    "prepare_imported": "invar.imported.decide",
    "is_imported_contract": "invar.imported.model",
    "is_imported_declaration": "invar.imported.model",
}
"""Each name of the package and the module that defines it, imported when the name is first used."""


__getattr__, __dir__ = facade(__name__, _EXPORTS, globals())


__all__ = ["ImportedDecision", "admit_imported", "is_imported_contract", "is_imported_declaration",
           "prepare_imported"]
