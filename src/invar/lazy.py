"""A package facade whose names are imported when first used (PEP 562): the package's `__getattr__` and `__dir__`
over a table of name → defining module, so importing the package costs nothing its caller does not use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def facade(package: str, exports: Mapping[str, str],
           namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose module globals are `namespace`: a name of `exports` is
    imported from its module when first asked for and kept in `namespace`, so it is looked up once."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
