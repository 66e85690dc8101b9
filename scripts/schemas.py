"""Write the JSON Schema of every command's `--json` output to docs/schemas/<command>.schema.json, and of a decision
receipt's predicate to docs/schemas/receipts/use-decision-v1.schema.json.

The schemas are generated from the typed models in `invar.cli.outputs`; after changing a command's output, change its
model and run `.venv/bin/python scripts/schemas.py`. `--check` writes nothing and exits 1 naming each schema that
is missing, stale, or no longer generated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from invar.cli.outputs import OUTPUT_SCHEMA_VERSION, OUTPUTS, documented
from invar.contract.outputs import ReceiptPredicate
from invar.contract.receipt import PREDICATE_TYPE

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "schemas"
RECEIPT = FOLDER / "receipts" / "use-decision-v1.schema.json"
"""The schema of a decision receipt's predicate (`ReceiptPredicate`, the model `use admit --receipt` signs)."""


def schema(name: str) -> dict[str, Any]:
    """The schema of one output: the model's, named and versioned (`$id` carries OUTPUT_SCHEMA_VERSION)."""
    body = documented()[name].model_json_schema()
    command = "invar " + ("--version" if name == "version" else name.replace("-", " ", 1))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:{OUTPUT_SCHEMA_VERSION.replace('/', ':')}:{name}",
        "$comment": f"The output of `{command} --json`. Generated from invar.cli.outputs by scripts/schemas.py; "
                    "do not edit by hand.",
        **body,
    }


def render(name: str) -> str:
    return json.dumps(schema(name), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_receipt() -> str:
    """The receipt predicate's schema, named by its in-toto predicate type."""
    documented()  # the core's models, described
    body = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": PREDICATE_TYPE,
        "$comment": "The predicate of the in-toto statement a decision receipt signs (`invar use admit --receipt`). "
                    "Generated from invar.contract.outputs by scripts/schemas.py; do not edit by hand.",
        **ReceiptPredicate.model_json_schema(),
    }
    return json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """What --check reports: each schema file that is missing, differs from its model, or has no model."""
    problems = []
    for name in sorted(OUTPUTS):
        path = FOLDER / f"{name}.schema.json"
        if not path.is_file():
            problems.append(f"{path.relative_to(ROOT)} is missing")
        elif path.read_text(encoding="utf-8") != render(name):
            problems.append(f"{path.relative_to(ROOT)} is stale")
    for path in sorted(FOLDER.glob("*.schema.json")):
        if path.name.removesuffix(".schema.json") not in OUTPUTS:
            problems.append(f"{path.relative_to(ROOT)} has no model in invar.cli.outputs")
    if not RECEIPT.is_file() or RECEIPT.read_text(encoding="utf-8") != render_receipt():
        problems.append(f"{RECEIPT.relative_to(ROOT)} is missing or stale")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any schema is stale")
    args = parser.parse_args()
    if args.check:
        problems = stale()
        for p in problems:
            print(f"{p}: regenerate with .venv/bin/python scripts/schemas.py", file=sys.stderr)
        return 1 if problems else 0
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name in sorted(OUTPUTS):
        (FOLDER / f"{name}.schema.json").write_text(render(name), encoding="utf-8")
    for path in FOLDER.glob("*.schema.json"):
        if path.name.removesuffix(".schema.json") not in OUTPUTS:
            path.unlink()
    RECEIPT.parent.mkdir(exist_ok=True)
    RECEIPT.write_text(render_receipt(), encoding="utf-8")
    print(f"{len(OUTPUTS)} schemas ({OUTPUT_SCHEMA_VERSION}) in {FOLDER.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
