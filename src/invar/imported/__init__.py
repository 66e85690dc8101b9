"""Imported evidence: deciding from the per-item scores lm-evaluation-harness, Inspect AI or a plain table
exported, with the same rules as a recorded decision, and saying in its premises that the scores are the
exporter's word (`invar.imported.decide`)."""

from invar.imported.decide import ImportedDecision, admit_imported, prepare_imported
from invar.imported.model import is_imported_contract, is_imported_declaration

__all__ = ["ImportedDecision", "admit_imported", "is_imported_contract", "is_imported_declaration",
           "prepare_imported"]
