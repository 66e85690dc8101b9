"""The declaration and contract of a decision from imported evidence: per-item scores another harness exported.

Decision: an imported contract is its own schema (`invar.imported/1`), not a use contract without packages. A use
contract's every number is bound to a call Invar made; an imported one names two export files by digest and the
scores in them are the exporter's word. Keeping them apart means no reader of a contract can take one for the other,
and `use admit` can say which it decided. The requirement (ε, δ, method, sequential) and the premises are the use
contract's own models, checked by the same rules.
"""

from __future__ import annotations

import json
import os
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from invar import canonical
from invar.contract.model import (
    MAX_DESCRIPTION,
    MAX_ENTRIES,
    MAX_TEXT,
    Hex64,
    Premise,
    Requirement,
    _check_method,
    _check_nesting,
    confidence_to_delta,
)
from invar.errors import ContractError
from invar.owner_files import Name, PathText, field_error, owner_text, read_owner_file

IMPORTED_SCHEMA = "invar.imported/1"
"""Names the layout of an imported contract's JSON."""

Format = Literal["lm-eval", "inspect", "table"]
"""`lm-eval`: lm-evaluation-harness `--log_samples` output (`samples_<task>_<time>.jsonl`), one file per model.
`inspect`: an Inspect AI eval log (`.eval` or `.json`), one per model. `table`: one JSONL or CSV file of
`id, reference_loss, candidate_loss`."""

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Model(BaseModel):
    model_config = _CONFIG


def _range(value: list[float]) -> list[float]:
    if len(value) != 2 or not value[0] < value[1]:
        raise ValueError(f"must be [a, b] with a < b; got {canonical.show(value, 60)}")
    return value


class ExportFile(_Model):
    """One export file as the declaration names it."""

    path: PathText
    """The file, relative to the declaration (in a contract: to the contract)."""
    sha256: Hex64 | None = None
    """sha256 of the file's bytes; `use prepare` pins it, and a declaration may state it to pin the file it means."""


class Source(_Model):
    """Where the per-item scores come from and how a score becomes a loss."""

    format: Format
    """The exporter's format (see `Format`)."""
    metric: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)] | None = None
    """The score to read: lm-eval's metric key in each sample (`exact_match`, `acc`), Inspect's scorer name
    (`exact`, `match`). Not used by `table`, whose losses are given."""
    filter: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)] = "none"
    """lm-eval only: the filter whose samples are read (lm-eval writes one sample per document and filter)."""
    loss: Literal["one-minus", "identity"] = "one-minus"
    """How a score becomes a loss: `one-minus` (loss = 1 − score, for accuracies) or `identity` (the score is a
    loss). `table` gives losses: identity only."""
    loss_range: Annotated[list[float], Field(max_length=2), AfterValidator(_range)] | None = None
    """[a, b]: the losses lie in this range and are graded (a bounded-range method decides). Omitted: losses are 0
    or 1, and any other value is refused."""
    order: Literal["unverified", "sampling"] = "unverified"
    """`sampling`: the reference export's order is the order the items were drawn, fixed before any was scored
    (needed for sequential admission, and for betting to use that order). `unverified`: nothing is claimed of it."""
    look_every: int | None = Field(default=None, ge=1, le=1 << 24)
    """Sequential admission only: the items between looks, in the reference export's order."""
    reference: ExportFile | None = None
    """The trusted side's export (`lm-eval`, `inspect`)."""
    candidate: ExportFile | None = None
    """The proposed side's export (`lm-eval`, `inspect`)."""
    table: ExportFile | None = None
    """The one file of paired losses (`table`)."""

    @model_validator(mode="after")
    def _consistent(self) -> Source:
        if self.format == "table":
            if self.table is None or self.reference is not None or self.candidate is not None:
                raise ValueError("imported: the table format reads one file; give imported.table and no "
                                 "reference or candidate")
            if self.loss != "identity":
                raise ValueError("imported.loss: a table gives losses; write loss = \"identity\"")
        else:
            if self.reference is None or self.candidate is None or self.table is not None:
                raise ValueError(f"imported: the {self.format} format reads one export per side; give "
                                 "imported.reference and imported.candidate, and no table")
            if self.metric is None:
                raise ValueError(f"imported.metric: name the score {self.format} exported (e.g. "
                                 f"{'exact_match' if self.format == 'lm-eval' else 'exact'})")
        return self

    def files(self) -> dict[str, ExportFile]:
        """The export files by role: `reference` and `candidate`, or `table`."""
        named = {"reference": self.reference, "candidate": self.candidate, "table": self.table}
        return {role: f for role, f in named.items() if f is not None}


def _check_requirement(requirement: Requirement, source: Source) -> None:
    eps = requirement.epsilon
    span = None if source.loss_range is None else Decimal(repr(source.loss_range[1] - source.loss_range[0]))
    if span is None and not Decimal(0) < eps < Decimal(1):
        raise ValueError(f"requirement.epsilon: must be in (0, 1); got {eps}")
    if span is not None and not Decimal(0) < eps < span:
        raise ValueError(f"requirement.epsilon: must be in (0, {span}) for losses in imported.loss_range; got {eps}")
    if requirement.standard == "population":
        if requirement.delta is None:
            raise ValueError("requirement.delta: the population standard needs δ (or confidence = 1 − δ); add it")
        if requirement.method is None:
            raise ValueError("requirement.method: the population standard needs a bound method; name one")
        _check_method(requirement.method, bool(requirement.sequential))
    elif requirement.delta is not None or requirement.method is not None:
        raise ValueError("requirement: the finite-domain standard uses no δ and no bound method; remove them")
    if requirement.max_n is not None:
        raise ValueError("requirement.max_n: an imported decision uses every paired item; remove max_n")
    if requirement.sequential:
        if requirement.standard != "population":
            raise ValueError("requirement.sequential: only the population standard decides sequentially")
        if source.order != "sampling" or source.look_every is None:
            raise ValueError("requirement.sequential: sequential admission needs the export order to be the "
                             "sampling order; set imported.order = \"sampling\" and imported.look_every")
    elif source.look_every is not None:
        raise ValueError("imported.look_every: only a sequential decision has looks; add requirement.sequential "
                         "= true or remove look_every")


class ImportDeclaration(_Model):
    """What an owner writes to decide from exports: the use, the exports, the requirement and the premises."""

    name: Name
    """The contract's name; `use prepare` writes `<name>.contract.json`."""
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    """What the use is, in the owner's words."""
    imported: Source
    """The exports and how their scores become losses."""
    requirement: Requirement
    """The allowed task-loss increase and the standard that decides it, as in a use contract."""
    premises: list[Premise] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """Assumptions the decision may rest on, besides the exporter's word on its scores (which it always states)."""

    @model_validator(mode="before")
    @classmethod
    def _confidence_to_delta(cls, data: Any) -> Any:
        return confidence_to_delta(data)

    @model_validator(mode="after")
    def _consistent(self) -> ImportDeclaration:
        _check_requirement(self.requirement, self.imported)
        return self


class PinnedExport(_Model):
    """One export file as the contract fixes it."""

    path: PathText
    """Relative to the contract."""
    sha256: Hex64
    """sha256 of the file's bytes when `use prepare` read it."""
    items: int = Field(ge=1)
    """Items the file held (lm-eval: samples under the declared filter)."""


class ImportedContract(_Model):
    """The canonical imported contract: what `use admit` reads."""

    contract_schema: Literal["invar.imported/1"] = Field(alias="schema", default="invar.imported/1")
    """Names this layout."""
    name: Name
    """The contract's name."""
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    """What the use is."""
    source: Source
    """The format, the score, how it becomes a loss; its files' paths are rewritten relative to the contract."""
    exports: dict[Literal["reference", "candidate", "table"], PinnedExport]
    """Each file pinned by digest and item count."""
    requirement: Requirement
    """As declared."""
    method_version: str | None = None
    """The bound method's version (population standard)."""
    premises: list[Premise] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """As declared, paths relative to the contract."""

    @model_validator(mode="after")
    def _consistent(self) -> ImportedContract:
        _check_requirement(self.requirement, self.source)
        if set(self.exports) != set(self.source.files()):
            raise ValueError("exports: must pin exactly the files imported names; re-run use prepare")
        return self

    def canonical_json(self) -> bytes:
        """Sorted keys, no insignificant whitespace, UTF-8, one final newline: the bytes the digest names."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return (json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def is_imported_declaration(path: str | os.PathLike[str]) -> bool:
    """Whether the TOML declaration at `path` declares imported evidence (an `[imported]` table). A file that
    cannot be read or parsed is left to the use contract's reader, which names what is wrong."""
    try:
        data = tomllib.loads(read_owner_file(Path(path), "declaration"))
    except (ContractError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return False
    return "imported" in data


def is_imported_contract(path: str | os.PathLike[str]) -> bool:
    """Whether the contract at `path` states the imported schema. Anything else is left to the use contract's
    reader, which names what is wrong."""
    try:
        obj = json.loads(read_owner_file(Path(path), "contract"))
    except (ContractError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("schema") == IMPORTED_SCHEMA


def read_import_declaration(path: str | os.PathLike[str]) -> ImportDeclaration:
    """Read and validate an imported-evidence declaration; `ContractError` naming the field at fault."""
    p = Path(path)
    text = read_owner_file(p, "declaration")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"{p}: not valid TOML ({exc}); fix the syntax") from None
    _check_nesting(data, str(p), "declaration")
    try:
        return ImportDeclaration.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc, str(p)) from None


def read_imported_contract(path: str | os.PathLike[str]) -> tuple[ImportedContract, str]:
    """Read an imported contract; returns it and the sha256 of its bytes, which must be its canonical form."""
    p = Path(path)
    raw = read_owner_file(p, "contract").encode()
    text = owner_text(raw, str(p), "contract")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise ContractError(f"{p}: not valid JSON; give the file use prepare wrote") from None
    if not isinstance(obj, dict):
        raise ContractError(f"{p}: a contract is a JSON object; give the file use prepare wrote")
    _check_nesting(obj, str(p), "contract")
    try:
        contract = ImportedContract.model_validate(obj)
    except ValidationError as exc:
        raise field_error(exc, str(p)) from None
    if contract.canonical_json() != raw:
        raise ContractError(f"{p}: the file is not in canonical form (edited by hand?); re-run use prepare")
    return contract, canonical.sha256(raw)


__all__ = [
    "IMPORTED_SCHEMA",
    "ExportFile",
    "Format",
    "ImportDeclaration",
    "ImportedContract",
    "PinnedExport",
    "Source",
    "is_imported_contract",
    "is_imported_declaration",
    "read_import_declaration",
    "read_imported_contract",
]
