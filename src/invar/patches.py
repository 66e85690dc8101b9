"""Candidate patches: the folders under `patches/` and the digest that names each one.

A package in a use contract names the patches it runs with (`patches: {name: sha256}`), and a worker started with
`--patch NAME=SHA256` recomputes the digest before it applies anything. Both sides use `patch_digest`, so the
admission covers exactly the code that produced the evidence.

The digest is `invar.canonical.tree_digest`'s (sha256 of the canonical map {relative path: file sha256}), except
that `__pycache__` folders and `*.pyc` files are left out: importing a patch writes bytecode next to it, and the
digest must not move because the patch ran. Everything else in the folder counts (code, README, data), so editing
any file makes a new candidate.

Pure Python: the patches themselves import torch, this module never does.
"""

from __future__ import annotations

import os
from pathlib import Path

from invar import canonical
from invar.errors import ContractError
from invar.home import HOME

PATCHES_DIR = HOME / "patches"
"""Where the patch folders live: one folder per patch, named by the patch."""

_IGNORED_DIRS = frozenset({"__pycache__"})
_IGNORED_SUFFIXES = (".pyc",)


def names() -> list[str]:
    """The patch names: every folder directly under `PATCHES_DIR` (hidden folders and `__pycache__` aside)."""
    if not PATCHES_DIR.is_dir():
        return []
    return sorted(p.name for p in PATCHES_DIR.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name not in _IGNORED_DIRS)


def patch_dir(name: str) -> Path:
    """The folder of the patch called `name`; an unknown name is a `ContractError` listing the patches there are."""
    if name in names():
        return PATCHES_DIR / name
    known = ", ".join(names()) or "none"
    raise ContractError(f"unknown patch {name!r}: {PATCHES_DIR} holds {known}; name one of those")


def patch_digest(name_or_path: str | Path) -> str:
    """The digest of a patch, given its name or its folder (a `Path`, or a string with a path separator).

    Like `invar.canonical.tree_digest`, with `__pycache__` folders and `*.pyc` files left out.
    """
    is_path = isinstance(name_or_path, Path) or os.sep in name_or_path or (
        os.altsep is not None and os.altsep in name_or_path)
    root = Path(name_or_path) if is_path else patch_dir(str(name_or_path))
    if not root.is_dir():
        raise ContractError(f"patch folder {root} does not exist; name a folder under {PATCHES_DIR}")
    files: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruned in place, so os.walk does not descend into bytecode caches.
        dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_DIRS)
        for fname in sorted(filenames):
            if fname.endswith(_IGNORED_SUFFIXES):
                continue
            full = os.path.join(dirpath, fname)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            files[rel] = canonical.file_sha256(full)
    if not files:
        raise ContractError(f"patch folder {root} holds no files; a patch needs at least its code and README")
    return canonical.digest(files)


def available() -> dict[str, str]:
    """Every patch under `PATCHES_DIR`: name → digest."""
    return {name: patch_digest(name) for name in names()}
