"""`invar.patches`: which patches there are, and the digest that names each one."""

from __future__ import annotations

import py_compile
import shutil
from pathlib import Path

import pytest

from invar import canonical
from invar.errors import ContractError
from invar.patches import PATCHES_DIR, available, names, patch_digest, patch_dir


def test_the_shipped_patches_are_listed_with_their_digests() -> None:
    assert {"split-k", "fixed-block"} <= set(names())
    digests = available()
    for name in ("split-k", "fixed-block"):
        assert digests[name] == patch_digest(name) == patch_digest(PATCHES_DIR / name)
        assert len(digests[name]) == 64
        assert (patch_dir(name) / "patch.py").is_file()
        assert (patch_dir(name) / "README.md").is_file()
    assert digests["split-k"] != digests["fixed-block"]


def test_an_unknown_name_is_refused_with_the_available_ones() -> None:
    with pytest.raises(ContractError) as info:
        patch_dir("no-such-patch")
    message = str(info.value)
    assert "\n" not in message
    assert "no-such-patch" in message
    assert "split-k" in message
    assert "fixed-block" in message
    with pytest.raises(ContractError):
        patch_digest("no-such-patch")


def test_the_digest_is_the_tree_digest_without_bytecode(tmp_path: Path) -> None:
    copy = tmp_path / "fixed-block"
    shutil.copytree(patch_dir("fixed-block"), copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    before = patch_digest(copy)
    assert before == patch_digest("fixed-block")
    assert before == canonical.tree_digest(copy), "without bytecode it is exactly the tree digest"
    # Importing the patch writes __pycache__/*.pyc next to it (as py_compile does here); the digest must not move.
    py_compile.compile(str(copy / "patch.py"), doraise=True)
    assert any(copy.glob("__pycache__/*.pyc"))
    (copy / "stray.pyc").write_bytes(b"bytecode")
    assert patch_digest(copy) == before
    # Anything else counts: an edited or added file is another candidate.
    (copy / "README.md").write_text((copy / "README.md").read_text() + "\nedited\n")
    assert patch_digest(copy) != before
    (copy / "notes.txt").write_text("x")
    edited = patch_digest(copy)
    (copy / "notes.txt").unlink()
    assert patch_digest(copy) != edited


def test_a_missing_or_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError):
        patch_digest(tmp_path / "absent")
    (tmp_path / "empty" / "__pycache__").mkdir(parents=True)
    (tmp_path / "empty" / "__pycache__" / "x.pyc").write_bytes(b"")
    with pytest.raises(ContractError):
        patch_digest(tmp_path / "empty")
