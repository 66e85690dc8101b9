"""README's map of the source tree names exactly what `src/invar` holds: every package, top-level module and worker,
and nothing that is gone, so a reader finds a concept where the map says it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "src" / "invar"


def _map_entries() -> tuple[set[str], set[str]]:
    """(children of src/invar/, children of src/invar/workers/) as README's map lists them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## How it is built", 1)[1].split("```", 2)[1]
    core = set(re.findall(r"^  (\S+)\s", block, re.MULTILINE))
    workers = set(re.findall(r"^    (\S+)\s", block, re.MULTILINE))
    return core, workers


def test_the_map_lists_every_package_and_module_of_the_core() -> None:
    core, workers = _map_entries()
    packages = {f"{p.name}/" for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in CORE.glob("*.py") if p.name != "__init__.py"}
    assert core == packages | modules
    assert workers == {p.name for p in (CORE / "workers").glob("*.py") if p.name != "__init__.py"}
