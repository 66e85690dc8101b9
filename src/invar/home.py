"""Where Invar finds what it ships: the tiny model, its populations, the candidate patches, example contracts.

Decisions this module embodies:

- **One setting, one order.** `INVAR_HOME` (a folder holding `models/`, `data/`, `patches/`, `contracts/`,
  `configs/`) wins when set; otherwise an installed wheel uses the copy it carries inside the package
  (`invar/_home`, written at build time by `setup.py`); otherwise the source checkout this module sits in. Nothing
  else is searched, so the same command never finds two different models.
- **The copy is the same bytes.** The wheel's `_home` is a plain copy of the checkout's folders (bytecode caches
  aside), so the shipped model, population and patch digests are the same wherever Invar runs.
- **Nothing is checked at import.** A missing folder is reported by whatever reads it, with its path.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "INVAR_HOME"
"""The environment variable that points Invar at another home folder."""

SHIPPED = ("models/tiny-arith", "data", "patches", "contracts", "configs")
"""The folders (relative to a home) a wheel carries; `setup.py` copies exactly these."""

_PACKAGE = Path(__file__).resolve().parent


def resolve(environ: dict[str, str] | None = None) -> Path:
    """The home folder: `$INVAR_HOME`, else the wheel's bundled copy, else the source checkout."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV)
    if chosen:
        return Path(chosen).expanduser().resolve()
    bundled = _PACKAGE / "_home"
    if bundled.is_dir():
        return bundled
    return _PACKAGE.parents[1]  # src/invar → the checkout's root


HOME = resolve()
"""The home folder this process uses (read once, at import)."""
