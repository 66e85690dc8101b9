"""Field docstrings read from a module's source when something shows them: the output schemas
(`invar.cli.outputs.documented`) and `invar train --help` (`invar.loop.config.field_help`).

Decision: the models keep their fields documented the way the rest of the code is (a string right under the
field), but pydantic's `use_attribute_docstrings` reads the source of every class while its module is imported,
which every command paid at start (about a tenth of a second for the outputs, the contract and the training
configuration together). Here the module's file is parsed once, only when asked, by pydantic's own rule: the
string statement right after a field's annotation, cleaned by `inspect.cleandoc`; a field takes the docstring of
the class that declares it.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

from pydantic import BaseModel


def field_docstrings(source: Path) -> dict[str, dict[str, str]]:
    """Class name → field name → docstring, for the classes at the top level of the Python file `source`."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    docs: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        found: dict[str, str] = {}
        for field, doc in zip(node.body, node.body[1:], strict=False):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                found[field.target.id] = inspect.cleandoc(doc.value.value)
        docs[node.name] = found
    return docs


def describe(module: str, *, rebuild: bool) -> None:
    """Give each field of the pydantic models defined in the imported module `module` (its name) that has no
    description its docstring; with `rebuild`, rebuild every model afterwards so that their JSON schemas carry the
    descriptions."""
    namespace = sys.modules[module]
    models = [m for m in vars(namespace).values()
              if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == module]
    docs = field_docstrings(Path(str(namespace.__file__)))
    for model in models:
        for name, field in model.model_fields.items():
            if field.description is None:
                owner = next((c for c in model.__mro__ if name in vars(c).get("__annotations__", {})), model)
                field.description = docs.get(owner.__name__, {}).get(name)
    if rebuild:
        for model in models:
            model.model_rebuild(force=True)
