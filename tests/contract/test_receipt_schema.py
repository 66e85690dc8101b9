"""A receipt's predicate and its published schema are one type (`ReceiptPredicate`): what `use admit --receipt`
signs validates against docs/schemas/receipts/use-decision-v1.schema.json, which scripts/schemas.py generates from
the model, and a predicate with a field the model does not name, or without one it requires, does not."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from contract_runs import RunWriter, make_workspace, unit_ids

from invar.contract.admit import admit
from invar.contract.outputs import ReceiptPredicate
from invar.contract.receipt import PREDICATE_TYPE, make_receipt, predicate, receipt_body

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "receipts" / "use-decision-v1.schema.json"
RELATIVE = {"required": True, "layouts": ["solo", "b4r"], "relative_to": "reference"}


def _signed_predicate(tmp_path: Path, **changes: Any) -> tuple[dict[str, Any], Any]:
    ws = make_workspace(tmp_path / "ws", units=40, **changes)
    run = RunWriter(ws, tmp_path / "run").complete(candidate_wrong=unit_ids(ws, 3)).close()
    decision = admit(ws.contract_path, run)
    envelope = make_receipt(decision, contract=ws.contract_path)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == PREDICATE_TYPE
    return statement["predicate"], decision


@pytest.mark.parametrize("changes", [{}, {"invariance": RELATIVE}],
                         ids=["population", "relative-invariance"])
def test_the_signed_predicate_is_the_models_and_validates(tmp_path: Path, changes: dict[str, Any]) -> None:
    signed, decision = _signed_predicate(tmp_path, **changes)
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["$id"] == PREDICATE_TYPE
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(signed)
    # The bytes signed are the model's, read back unchanged; the older layout's body is the same and its schema.
    again = ReceiptPredicate.model_validate(signed).model_dump(mode="json", exclude_unset=True)
    assert again == signed == predicate(decision).model_dump(mode="json", exclude_unset=True)
    assert receipt_body(decision) == {"schema": "invar.receipt/1", **signed}
    assert ("relative_to" in signed["figures"]["invariance"]) == bool(changes)
    extra = copy.deepcopy(signed)
    extra["figures"]["sequence"] = 1
    missing = copy.deepcopy(signed)
    del missing["evidence"]
    for bad in (extra, missing):
        assert not validator.is_valid(bad)
