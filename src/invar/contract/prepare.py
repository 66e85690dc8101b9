"""`use prepare`: turn an owner's declaration into the canonical contract, checking every anchor it names.

A contract that names a digest the files do not have would fail only at admission, after the whole run; so
`prepare` hashes what the declaration points at (population file, model and adapter folders, checked premises)
and refuses any mismatch now, naming the field. It also derives the execution plan once, so a declaration whose
layouts cannot be told apart on its units is refused before anything runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from invar import canonical, patches
from invar.contract.model import (
    Adapter,
    ConfigChange,
    Contract,
    Declaration,
    Package,
    PackageDeclaration,
    Population,
    Premise,
    Requirement,
    Scorer,
    read_contract,
    read_declaration,
)
from invar.contract.plan import ExecutionPlan, PromptEncoder, Role, derive_plan
from invar.contract.plan_inputs import load_for_planning as load_for_planning  # `use plan`'s read, kept here too
from invar.contract.plan_inputs import range_methods
from invar.engines import worker_digest
from invar.errors import ContractError, one_line
from invar.formats.model_config import folder_config, read_config, show_value
from invar.formats.model_config import same_value as same_config_value
from invar.formats.tokenizer import ModelTokenizer, tokenizer_digest
from invar.owner_files import field_error
from invar.stats.bounds import BINARY_METHODS, VERSIONS
from invar.stats.sequential import BINARY_SEQUENTIAL_METHODS, SEQUENTIAL_VERSIONS
from invar.tasks.arithmetic import SCORER_NAME as ARITHMETIC
from invar.tasks.population import Unit as PopulationUnit
from invar.tasks.population import load_units
from invar.tasks.scorers import Scorer as ScorerImpl
from invar.tasks.scorers import UserScorer, check_units, load_scorer
from invar.tasks.special_tokens import check_model_tokens
from invar.worker_code import WorkerCodeError

ROLES: tuple[Role, Role] = ("reference", "candidate")


@dataclass(frozen=True)
class Prepared:
    """What `prepare` wrote: the contract, its sha256, where it lies, and the plan derived from it."""

    contract: Contract
    sha256: str
    path: Path
    digest_path: Path
    plan: ExecutionPlan


def relative_path(target: Path, start: Path) -> str:
    """`target` relative to `start`, with forward slashes, so the contract moves with the files it names."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def output_folder(out_dir: str | os.PathLike[str] | None, declaration_path: Path) -> Path:
    """The folder `prepare` writes to (`out_dir`, default the declaration's folder), created; one line if not."""
    out = Path(out_dir) if out_dir is not None else declaration_path.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ContractError(f"{out}: cannot create the output folder ({exc.strerror or exc}); choose another "
                            "--out") from None
    return out


def write_contract(out: Path, name: str, data: bytes) -> tuple[str, Path, Path]:
    """Write a contract's canonical bytes to `out/<name>.contract.json` and its digest, in `sha256sum` format, beside
    it; returns the sha256 and both paths. A different contract of the same name is never overwritten (a contract,
    once named, never changes)."""
    sha = canonical.sha256(data)
    path = out / f"{name}.contract.json"
    digest_path = out / f"{name}.contract.json.sha256"
    try:
        if path.exists() and path.read_bytes() != data:
            raise ContractError(
                f"{path}: a different contract of this name already exists; give the declaration a new name "
                "or move the old contract away"
            )
        path.write_bytes(data)
        digest_path.write_text(f"{sha}  {path.name}\n", encoding="ascii")
    except OSError as exc:
        raise ContractError(f"{path}: cannot write the contract ({exc.strerror or exc}); choose another --out") \
            from None
    return sha, path, digest_path


@contextlib.contextmanager
def _reading(field: str, path: Path) -> Iterator[None]:
    """A path the declaration names that cannot be read (a name too long, no permission, not UTF-8 where text is
    expected) is one line naming the field, never a traceback."""
    try:
        yield
    except OSError as exc:
        raise ContractError(one_line(f"{field}: cannot read {path} ({exc.strerror or exc}); check the path and "
                                     "its permissions")) from None
    except UnicodeDecodeError as exc:
        raise ContractError(one_line(f"{field}: {path} is not UTF-8 text ({exc.reason} at byte {exc.start:,}); "
                                     "point it at the file the digest names")) from None
    except ContractError as exc:  # a reader below names the path as given: a control character in it is escaped
        shown = one_line(str(exc))
        if shown != str(exc):
            raise ContractError(shown) from None
        raise


def _validated(model: type[Package] | type[Contract], fields: dict[str, Any]) -> Any:
    # The declaration passed, but a rewritten path (relative to the output folder) can still break a limit.
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise field_error(exc, "contract") from None


def _tree(field: str, folder: Path, declared: str) -> None:
    with _reading(field, folder):
        if not folder.is_dir():
            raise ContractError(f"{field}: folder {folder} does not exist; point it at the folder")
        try:
            actual = canonical.tree_digest(folder)
        except canonical.CanonicalError as exc:
            raise ContractError(f"{field}: {exc}; point it at the folder the digest names") from None
    if actual != declared:
        raise ContractError(
            f"{field}: folder {folder} has tree digest {actual}, but {declared} was declared; "
            "declare this folder's digest or point at the folder the digest names"
        )


def _worker(role: Literal["reference", "candidate"], decl: PackageDeclaration) -> str:
    """The package's worker code digest: the one the worker files here have; a declared one must be it."""
    try:
        actual = worker_digest(decl.engine)
    except WorkerCodeError as exc:
        raise ContractError(f"{role}.worker_digest: {exc}") from None
    if decl.worker_digest is not None and decl.worker_digest != actual:
        raise ContractError(
            f"{role}.worker_digest: the {decl.engine} worker's code here has worker digest {actual}, but "
            f"{decl.worker_digest} was declared; declare this code's digest (invar use package {decl.engine} prints "
            "it) or prepare where the worker code the digest names is installed")
    return actual


def _package(role: Literal["reference", "candidate"], decl: PackageDeclaration, base: Path, out: Path,
             chat: bool) -> Package:
    model_dir = base / decl.model_dir
    _tree(f"{role}.model_digest", model_dir, decl.model_digest)
    with _reading(f"{role}.model_dir", model_dir):
        try:
            # a folder whose metadata and tokenizer disagree on the BOS or the end of a turn would run, and run wrong
            check_model_tokens(ModelTokenizer.from_model_dir(model_dir), chat, "invar use init --add-end-ids")
        except ContractError as exc:
            raise ContractError(f"{role}.model_dir: {exc}") from None
    adapter = None
    if decl.adapter is not None:
        adapter_dir = base / decl.adapter.path
        _tree(f"{role}.adapter.digest", adapter_dir, decl.adapter.digest)
        adapter = Adapter(path=relative_path(adapter_dir, out), digest=decl.adapter.digest)
    fields: dict[str, Any] = {
        **decl.model_dump(),
        "model_dir": relative_path(model_dir, out),
        "adapter": adapter,
        "patches": _patches(role, decl, base, out),
    }
    with _reading(f"{role}.model_dir", model_dir):
        fields["tokenizer_digest"] = tokenizer_digest(model_dir)
    fields["worker_digest"] = _worker(role, decl)
    package: Package = _validated(Package, fields)
    return package


def _patches(role: Literal["reference", "candidate"], decl: PackageDeclaration, base: Path, out: Path) -> dict[
        str, str]:
    """The package's patches, each folder hashed now (an edited file is refused here, not at `use run`) and a
    folder's path rewritten relative to the contract; a kernel's `kernel.toml` checked against the engine."""
    out_patches: dict[str, str] = {}
    for key, sha in decl.patches.items():
        field = f"{role}.patches.{key}"
        if not patches.is_path(key) and key not in patches.names():
            # A name this Invar does not ship (a contract prepared for a home that has it): `use run` finds it or
            # refuses, as before; a folder path or a shipped name is checked now.
            out_patches[key] = sha
            continue
        with _reading(field, base / key):
            folder = patches.patch_dir(key, base)
            patches.check_folder(key, sha, folder, field, declared=True)
            patches.check_engine(folder, decl.engine, field)
        out_patches[patches.contract_key(folder, out) if patches.is_path(key) else key] = sha
    return out_patches


def package_tokenizers(contract: Contract, folders: Mapping[Role, Path]) -> dict[Role, ModelTokenizer]:
    """Each package's tokenizer, read from `folders[role]` (its model folder, or a run's kept copy of its files) and
    checked against the digest the contract fixes for it."""
    out: dict[Role, ModelTokenizer] = {}
    for role in ROLES:
        tokenizer = ModelTokenizer.from_model_dir(folders[role])
        if tokenizer.digest != contract.package(role).tokenizer_digest:
            raise ContractError(f"{role}.model_dir: the tokenizer files in {folders[role]} are not the ones the "
                                "contract names; point the contract at the right model folder")
        out[role] = tokenizer
    return out


def prompt_encoders(tokenizers: Mapping[Role, ModelTokenizer]) -> dict[Role, PromptEncoder]:
    """Each package's rendering and tokenization of a unit, as `derive_plan` takes it: a plain prompt as is, encoded
    with the tokenizer's special tokens (as an engine adds them to text); chat messages rendered by the model's chat
    template (with the generation prompt) and encoded without them (the template writes its own)."""
    return {role: tokenizers[role].unit_prompt for role in ROLES}


def model_folders(contract: Contract, base: Path) -> dict[Role, Path]:
    """Each package's model folder, as the contract names it relative to its own folder `base`."""
    return {role: base / contract.package(role).model_dir for role in ROLES}


def _premise(index: int, premise: Premise, base: Path, out: Path) -> Premise:
    if premise.basis_path is None:
        return premise
    basis = base / premise.basis_path
    with _reading(f"premises[{index}].basis_path", basis):
        if not basis.is_file():
            raise ContractError(f"premises[{index}].basis_path: file {basis} does not exist; point it at the basis")
        actual = canonical.file_sha256(basis)
    if actual != premise.basis_sha256:
        raise ContractError(
            f"premises[{index}].basis_sha256: {basis} has sha256 {actual}, but {premise.basis_sha256} was declared"
        )
    return premise.model_copy(update={"basis_path": relative_path(basis, out)})


def method_version(method: str) -> str:
    """The version of a bound method's arithmetic (fixed-n or sequential), as the statistics module names it."""
    return VERSIONS[method] if method in VERSIONS else SEQUENTIAL_VERSIONS[method]


def build_contract(declaration: Declaration, base: Path, out: Path) -> tuple[Contract, tuple[PopulationUnit, ...]]:
    """Check every anchor of `declaration` (paths relative to `base`) and build the contract for folder `out`.

    Returns the contract and its population's units. Raises `ContractError` naming the field at fault.
    """
    pop = declaration.population
    pop_path = base / pop.path
    units = _population(pop_path, pop.sha256)
    if pop.sample is not None and pop.sample > len(units):
        raise ContractError(
            f"population.sample: {pop.sample} exceeds the {len(units)} units of {pop_path}; lower it"
        )
    requirement = declaration.requirement
    chat = any(u.messages is not None for u in units)
    fields: dict[str, Any] = {
        **{k: v for k, v in declaration
           if k not in ("population", "reference", "candidate", "premises", "scorer", "config_changes")},
        "population": Population(
            path=relative_path(pop_path, out), sha256=pop.sha256, size=len(units), unit=pop.unit, sample=pop.sample
        ),
        "scorer": _scorer(declaration.scorer, requirement, units, base, out),
        "method_version": None if requirement.method is None else method_version(requirement.method),
        "reference": _package("reference", declaration.reference, base, out, chat),
        "candidate": _package("candidate", declaration.candidate, base, out, chat),
        "premises": [_premise(i, p, base, out) for i, p in enumerate(declaration.premises)],
        "config_changes": config_changes(declaration, base),
    }
    contract: Contract = _validated(Contract, fields)
    return contract, units


def _config_json(role: Role, folder: Path) -> dict[str, Any]:
    with _reading(f"{role}.model_dir", folder / "config.json"):
        try:
            return read_config(folder)
        except ValueError as exc:  # not JSON, or not an object
            raise ContractError(one_line(f"{role}.model_dir: {folder / 'config.json'} is not a model configuration "
                                         f"({exc}); point it at a model folder")) from None


def _folder_configuration(role: Role, folder: Path) -> dict[str, Any]:
    field = f"{role}.model_dir"
    config = _config_json(role, folder)
    with _reading(field, folder / "config.json"):
        try:
            return folder_config(config)
        except (KeyError, TypeError, ValueError) as exc:
            raise ContractError(one_line(f"{field}: {folder / 'config.json'} does not give the model's "
                                         f"configuration ({type(exc).__name__}: {exc}); point it at a model folder "
                                         "whose config.json transformers reads")) from None


def config_changes(declaration: Declaration, base: Path) -> dict[str, ConfigChange]:
    """The effective-configuration fields in which the candidate's model differs from the reference's, each with
    both values; refused (one line naming the field, both values and how to declare it) where the declaration does
    not name the field in `config_changes`, or names a field in which the two do not differ.

    Each package's configuration is its folder's config.json read the transformers way (`folder_config`): `use run`
    refuses a worker whose reported configuration differs from its folder's in a field the package does not declare
    a known premise, so these are the configurations the two packages compute with. A pair of folders without
    config.json, or whose config.json names no decoder layers (a model no engine here builds), has nothing to
    compare; nor has a pair whose config.json files are the same bytes.
    """
    folders = {"reference": base / declaration.reference.model_dir, "candidate": base / declaration.candidate.model_dir}
    files = [folder / "config.json" for folder in folders.values()]
    comparable = all(file.is_file() for file in files)
    with _reading("candidate.model_dir", files[1]):
        comparable = comparable and files[0].read_bytes() != files[1].read_bytes() and all(
            "num_hidden_layers" in _config_json(role, folders[role]) for role in ROLES)
    if not comparable:
        if declaration.config_changes:
            raise ContractError(f"config_changes: the two model folders give the same configuration (no "
                                f"config.json of a decoder, or the same bytes), so the contract changes nothing in "
                                f"{declaration.config_changes[0]}; remove it")
        return {}
    ref, cand = (_folder_configuration(role, folders[role]) for role in ROLES)
    declared = set(declaration.config_changes)
    out: dict[str, ConfigChange] = {}
    for field in ref:
        if same_config_value(field, ref[field], cand[field]):
            if field in declared:
                raise ContractError(f"config_changes: the candidate's model computes {field} as the reference's "
                                    f"({show_value(ref[field])}), so the contract changes nothing there; remove it")
            continue
        if field not in declared:
            raise ContractError(
                f"candidate.model_dir: the candidate's config.json gives {field} = {show_value(cand[field])}, the "
                f"reference's {show_value(ref[field])}: the two packages compute different models; point both at the "
                f"same configuration, or declare the change as the contract's purpose (config_changes = "
                f"[\"{field}\"])")
        out[field] = ConfigChange(reference=ref[field], candidate=cand[field])
    return out


def check_config_changes(contract: Contract, base: Path) -> None:
    """The configuration changes the contract records must be the ones its two model folders (relative to the
    contract's folder `base`) give now: `ContractError` naming the field and both values where this Invar reads the
    folders otherwise (a contract prepared by an Invar that read config.json differently: prepare it again)."""
    if not contract.config_changes:
        return  # nothing recorded; each worker is still checked against its own folder at load_model
    folders = {role: base / contract.package(role).model_dir for role in ROLES}
    configs = {role: _folder_configuration(role, folder) for role, folder in folders.items()}
    for field, change in contract.config_changes.items():
        for role, folder in folders.items():
            value = configs[role][field]
            recorded = getattr(change, role)
            if not same_config_value(field, recorded, value):
                raise ContractError(f"config_changes.{field}: the contract records {show_value(recorded)} for the "
                                    f"{role}, this Invar reads {show_value(value)} from {folder / 'config.json'}; "
                                    "prepare the contract again from its declaration")


def _scorer(declared: Scorer, requirement: Requirement, units: Sequence[PopulationUnit], base: Path,
            out: Path) -> Scorer:
    """The contract's scorer: loaded (a user scorer's file read and pinned), checked against every unit's answer and
    against the requirement's bound method, its version fixed, a user scorer's path made relative to the contract's
    folder."""
    try:
        scorer = load_scorer(declared.name, declared.settings, base, declared.sha256)
        check_units(scorer, units)
    except ContractError as exc:
        raise ContractError(f"scorer: {exc}") from None
    check_method_fits(requirement, scorer)
    name, sha256 = declared.name, None
    if isinstance(scorer, UserScorer):
        name = f"{relative_path(base / scorer.path, out)}:{declared.name.rsplit(':', 1)[1]}"
        sha256 = scorer.sha256
    version = None if declared.name == ARITHMETIC else scorer.version
    return Scorer(name=name, settings=declared.settings, version=version, sha256=sha256)


def check_method_fits(requirement: Requirement, scorer: ScorerImpl) -> None:
    """A scorer whose losses are not 0/1 is decided by a bounded-range method only: the binary methods count worse
    and better units, which says nothing about how much worse. `ContractError` naming `requirement.method`."""
    method = requirement.method
    if scorer.binary or method is None:
        return
    if method in BINARY_METHODS or method in BINARY_SEQUENTIAL_METHODS:
        low, high = scorer.loss_range
        raise ContractError(f"requirement.method: {method} decides on 0/1 losses, but scorer {scorer.name} gives "
                            f"losses in [{low:g}, {high:g}] (binary = false); use "
                            f"{' or '.join(range_methods(bool(requirement.sequential)))}, or declare the scorer "
                            "binary = true with loss_range = [0, 1]")


def difference_range(scorer: ScorerImpl) -> tuple[float, float]:
    """The range [a − b, b − a] of a paired difference (candidate loss minus reference loss) under `scorer`, whose
    losses lie in [a, b]: [-1, 1] for 0/1 losses."""
    if scorer.binary:
        return -1.0, 1.0
    low, high = scorer.loss_range
    # Rounding is monotone, so every rounded difference of two losses in [a, b] lies within the rounded span.
    return low - high, high - low


def contract_scorer(contract: Contract, base: Path) -> ScorerImpl:
    """The contract's scorer as this Invar computes it (a user scorer's file read relative to the contract's folder
    `base` and checked against its pinned digest); refused when this Invar's version of it differs."""
    declared = contract.scorer
    try:
        scorer = load_scorer(declared.name, declared.settings, base, declared.sha256)
    except ContractError as exc:
        raise ContractError(f"scorer: {exc}") from None
    if declared.version is not None and scorer.version != declared.version:
        raise ContractError(f"scorer: the contract fixes {declared.name} version {declared.version}, this Invar "
                            f"scores with version {scorer.version}; decide with the Invar version the contract names")
    check_method_fits(contract.requirement, scorer)  # a contract not written by use prepare is checked here
    return scorer


def _population(path: Path, sha256: str) -> tuple[PopulationUnit, ...]:
    with _reading("population.path", path):
        try:
            return load_units(path, sha256)
        except ContractError as exc:
            raise ContractError(f"population: {exc}") from None


def prepare(declaration_path: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> Prepared:
    """Validate a declaration and write `<name>.contract.json` and `<name>.contract.json.sha256` to `out_dir`.

    `out_dir` defaults to the declaration's folder. The `.sha256` file is in `sha256sum` format. Refuses to
    overwrite an existing contract of the same name that differs (a contract, once named, never changes).
    """
    decl_path = Path(declaration_path)
    declaration = read_declaration(decl_path)
    out = output_folder(out_dir, decl_path)
    contract, units = build_contract(declaration, decl_path.parent, out)
    data = contract.canonical_json()
    sha = canonical.sha256(data)
    encoders = prompt_encoders(package_tokenizers(contract, model_folders(contract, out)))
    plan = derive_plan(contract, sha, units, encoders)
    sha, path, digest_path = write_contract(out, contract.name, data)
    return Prepared(contract=contract, sha256=sha, path=path, digest_path=digest_path, plan=plan)


def load_contract(path: str | os.PathLike[str]) -> tuple[Contract, str, ExecutionPlan]:
    """Read a contract file and derive its plan; the population is read relative to the contract file.

    Returns the contract, its sha256 (of the file's bytes) and its execution plan.
    """
    p = Path(path)
    contract, sha = read_contract(p)
    units = _population(p.parent / contract.population.path, contract.population.sha256)
    with _reading("model_dir", p.parent):
        encoders = prompt_encoders(package_tokenizers(contract, model_folders(contract, p.parent)))
    return contract, sha, derive_plan(contract, sha, units, encoders)
