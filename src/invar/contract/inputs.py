"""Reading the owner's inputs for a decision: the files a contract fixes by digest, and the plan derived from them.

A contract names its population and each package's tokenizer by digest; the plan (every call and seed) follows
from those bytes. They are read from beside the contract when they are there, else from the copies a run keeps in
its meta (`run_inputs`, which `use run` writes), and every byte is checked against the contract's digests either
way, so a run can be decided from a folder holding only the run and the contract without trusting the run for any
of them. This is its own module because `use run` keeps what admission later reads: the two must agree on the form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar import patches
from invar.contract.model import Contract
from invar.contract.plan import ExecutionPlan, Role, derive_plan
from invar.contract.prepare import ROLES, method_version, model_folders, package_tokenizers, prompt_encoders
from invar.errors import ContractError, EvidenceError
from invar.formats.tokenizer import BASE_FILES, ModelTokenizer, from_kept, kept_files
from invar.records.store import RunStore
from invar.tasks.population import load_unit_table


@dataclass(frozen=True)
class Inputs:
    """Where admission reads the files the contract fixes by digest: the population and each tokenizer folder."""

    population: Path
    tokenizers: Mapping[Role, Path]


def run_inputs(contract: Contract, base: Path) -> dict[str, Any]:
    """The files a contract fixes by digest, as bytes, for a run to keep beside its records (meta `inputs`).

    A run that carries them can be decided from a folder holding only the run and the contract: every byte is still
    checked against the contract's digests, so where the bytes come from does not matter.
    """
    population = (base / contract.population.path).read_bytes()
    folders = model_folders(contract, base)
    out: dict[str, Any] = {"population": population,
                           "tokenizers": {role: kept_files(folders[role]) for role in ROLES}}
    kept = {role: {key: patches.kept_files(patches.patch_dir(key, base)) for key in contract.package(role).patches
                   if patches.is_path(key) or key in patches.names()}
            for role in ROLES if contract.package(role).patches}
    if kept:  # only a patched run keeps them, so an unpatched run's meta is unchanged
        out["patches"] = kept
    return out


def check_patch_folders(contract: Contract, base: Path, kept: Any) -> None:
    """Every patch or kernel folder a package names must still be the one the contract pins: the folder beside the
    contract where it is there (a changed file is one `ContractError` line naming the folder, both digests and what
    to do), else the copy the run keeps (meta `inputs.patches`), so a decision never covers other code than ran."""
    kept_patches = kept.get("patches") if isinstance(kept, dict) else None
    for role in ROLES:
        for key, sha in contract.package(role).patches.items():
            where = f"{role}.patches.{key}"
            folder = base / key if patches.is_path(key) else patches.PATCHES_DIR / key
            if not folder.is_dir() and not patches.is_path(key):
                continue  # a name this Invar does not ship: the records' identities carry its digest, as before
            if not folder.is_dir():
                copy = kept_patches.get(role, {}).get(key) if isinstance(kept_patches, dict) else None
                if not isinstance(copy, dict):
                    raise ContractError(f"{where}: the folder is not beside the contract ({base / key}) and the run "
                                        "keeps no copy of it; put the contract beside the folder it names")
                if patches.kept_digest(copy) != sha:
                    raise EvidenceError(f"{where}: the run's kept copy of the folder has another digest than the "
                                        f"contract pins ({sha[:16]}…); the run's records are not of this contract")
                continue
            patches.check_folder(key, sha, folder, where)


def resolve_inputs(contract: Contract, base: Path, kept: Any, scratch: Path) -> Inputs:
    """The contract's files beside the contract if they are there, else the copies the run keeps (written into
    `scratch`); the caller checks every one against the contract's digests."""
    population = base / contract.population.path
    tokenizers: dict[Role, Path] = model_folders(contract, base)
    if population.is_file() and all((tokenizers[r] / n).is_file() for r in ROLES for n in BASE_FILES):
        return Inputs(population, tokenizers)
    if not isinstance(kept, dict) or not isinstance(kept.get("population"), bytes) \
            or not isinstance(kept.get("tokenizers"), dict):
        raise ContractError(f"population: {population} or a tokenizer folder is missing beside the contract, and the "
                            "run keeps no copy of them; put the contract beside the files it names")
    population = scratch / "population.jsonl"
    population.write_bytes(kept["population"])
    for role in ROLES:
        files = kept["tokenizers"].get(role)
        folder = scratch / role
        folder.mkdir()
        if not isinstance(files, dict):
            raise EvidenceError(f"the run's kept inputs lack the {role}'s tokenizer; put the contract beside the "
                                "files it names")
        from_kept(files, folder)  # refuses a copy without the base files, before anything reads it
        tokenizers[role] = folder
    return Inputs(population, tokenizers)


def _needs_kept(contract: Contract, base: Path) -> bool:
    """Whether reading the contract's files needs the run's kept copies: a population, tokenizer or patch folder
    that `resolve_inputs` or `check_patch_folders` would read from them."""
    population = base / contract.population.path
    tokenizers = model_folders(contract, base)
    if not (population.is_file() and all((tokenizers[r] / n).is_file() for r in ROLES for n in BASE_FILES)):
        return True
    return any(patches.is_path(key) and not (base / key).is_dir() for role in ROLES
               for key in contract.package(role).patches)


def check_method_version(contract: Contract, remedy: str) -> None:
    """The contract's bound method must be the version this Invar computes (`ContractError`, ending in `remedy`):
    an owner's contract fixes the method's version, and another version's numbers would not be the ones it fixed."""
    method = contract.requirement.method
    if method is not None and method_version(method) != contract.method_version:
        raise ContractError(f"method_version: the contract fixes {contract.method_version}, this Invar computes "
                            f"{method_version(method)}; {remedy}")


def read_anchors(contract: Contract, sha: str, base: Path, store: RunStore, scratch: Path) -> tuple[
        ExecutionPlan, dict[Role, ModelTokenizer]]:
    """The plan and each package's tokenizer, from the files the contract fixes by digest (beside the contract at
    `base`, or the copies the run keeps, written into `scratch`), every one checked against the contract."""
    # The run's kept copies (its population among them) are read only when a file is not beside the contract.
    kept = store.meta("inputs").get("inputs") if _needs_kept(contract, base) else None
    check_patch_folders(contract, base, kept)
    inputs = resolve_inputs(contract, base, kept, scratch)
    units = load_unit_table(inputs.population, contract.population.sha256)  # compact: built when read
    tokenizers = package_tokenizers(contract, inputs.tokenizers)
    encoders = prompt_encoders(tokenizers)
    if tokenizers["reference"].digest == tokenizers["candidate"].digest:
        # the same files encode alike: one encoder for both, so the plan encodes and digests each call's params once
        encoders["candidate"] = encoders["reference"]
    plan = derive_plan(contract, sha, units, encoders)
    return plan, tokenizers


__all__ = [
    "Inputs",
    "check_method_version",
    "check_patch_folders",
    "read_anchors",
    "resolve_inputs",
    "run_inputs",
]
