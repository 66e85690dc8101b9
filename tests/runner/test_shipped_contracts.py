"""The contracts in contracts/ name packages that this installation really runs: each package's identity equals a
worker's started with the package's settings and patches, and each patch digest is the folder's. A version bump, a
worker change that alters its settings, or an edited patch shows here, not in the middle of a `use run`."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from invar.contract.model import parse_declaration
from invar.patches import patch_digest, patch_dir
from invar.runner.engine import Engine, check_identity, probe_identity

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

pytestmark = pytest.mark.engine

DECLARATIONS = sorted((REPO_ROOT / "contracts").glob("*.toml"))


def _packages() -> dict[str, list[tuple[str, Any]]]:
    """Packages grouped by what starts their worker: (engine, launch settings, patches) → [(where, package)]."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for path in DECLARATIONS:
        decl = parse_declaration(tomllib.loads(path.read_text(encoding="utf-8")), path.name)
        for role in ("reference", "candidate"):
            pkg = getattr(decl, role)
            key = repr((pkg.engine, sorted(pkg.patches.items()), pkg.settings.get("device"),
                        pkg.settings.get("threads")))
            groups.setdefault(key, []).append((f"{path.name} {role}", pkg))
    return groups


def test_every_shipped_contract_is_checked() -> None:
    assert {p.stem for p in DECLARATIONS} >= {"arith-fixed-block", "arith-split-k", "arith-nf4-fixed-block",
                                               "arith-vllm", "arith-finite", "arith-nf4", "walkthrough"}


@pytest.mark.parametrize("group", sorted(_packages()))
def test_packages_are_what_the_workers_report(group: str) -> None:
    packages = _packages()[group]
    first = packages[0][1]
    for name, sha in first.patches.items():
        assert patch_digest(patch_dir(name)) == sha, f"{packages[0][0]}: patch {name} was edited; re-pin it"
    identity = probe_identity(Engine(first.engine), first.settings, first.patches)
    for where, pkg in packages:
        check_identity(identity, pkg.engine_version, pkg.expected_settings(), where)
