"""The owner's declaration and the canonical use contract.

A declaration is what the owner writes (TOML); the contract is what every later step reads. The two differ in
one way that matters: the contract is fixed. `prepare` checks each anchor it can (the population file's digest,
the model folders' tree digests, the files a checked premise rests on), records the digests it had to compute
(each tokenizer file, the bound method's version), rewrites paths relative to the contract file, and writes
canonical JSON whose sha256 names the contract. Seeds, the sample of units and every call are then functions of
that contract alone, so nothing in them can be chosen after data exists.

Numbers the decision compares exactly (ε, δ) are decimals, written as strings in the JSON, never binary floats.

Every size is bounded (the `MAX_*` limits below, listed in docs/contract.md), so a hostile or mistaken file gets
one line naming the limit, never a traceback, a recursion error or an unbounded message.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from invar import canonical
from invar.compare.steps import MAX_STEPS, check_step
from invar.engines import EngineName
from invar.errors import ContractError
from invar.formats.model_config import FIELDS as CONFIG_FIELDS

# The file size and path limits, the reader and the one-line report are shared with training configurations
# (`invar.owner_files`); re-exported so that `invar.contract.model.MAX_*` still lists every contract limit.
from invar.owner_files import MAX_FILE_BYTES as MAX_FILE_BYTES
from invar.owner_files import MAX_PATH as MAX_PATH
from invar.owner_files import (
    Name,
    PathText,
    check_launch_settings,
    check_name,
    field_error,
    owner_text,
    read_owner_file,
)
from invar.stats.bounds import METHODS
from invar.stats.sequential import SEQUENTIAL_METHODS

CONTRACT_SCHEMA = "invar.contract/1"
"""Names the layout of the contract JSON; a contract of another schema is refused, never guessed at."""

# --- limits: real declarations are a few kilobytes and nest four levels; these leave room and stop the absurd ----

MAX_NESTING = 32
"""Tables and arrays (TOML), objects and arrays (JSON) nest at most 32 levels, the document itself being one."""
MAX_DESCRIPTION = 4096
"""Characters in `description`."""
MAX_STATEMENT = 1024
"""Characters in a premise's `statement`."""
MAX_TEXT = 256
"""Characters in a premise's `party`, a bound method's name, a package name or version, a patch name."""
MAX_ENTRIES = 64
"""Entries in `engine_version`, `patches`, `settings` (each map), `scorer.settings` and `premises`."""
MAX_LAYOUTS = 16
"""Layouts a contract declares."""
MAX_PLACES = 28
"""Digits after the decimal point in ε, δ or the confidence (kept exactly; more would be rounded silently)."""


# --- field types -------------------------------------------------------------------------------------------------


def _show(value: object) -> str:
    """A bounded repr for messages: one line, however long or strange the value."""
    return canonical.show(value, 60)


def _hex64(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"must be a sha256 written as 64 lowercase hex digits; got {_show(value)}")
    return value


def _wire_value(value: Any, depth: int = 0) -> None:
    """Refuse what a worker's identity cannot report (so could never match): a datetime, a non-finite number, an
    integer past 64 bits. Only JSON's kinds of value pass, nested no deeper than the file may nest."""
    if depth > MAX_NESTING:
        raise ValueError(f"nests more than {MAX_NESTING} levels deep; flatten it")
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise ValueError(f"holds the integer {_show(value)}, which does not fit in 64 bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"holds {value}; settings must be finite numbers")
        return
    if isinstance(value, list):
        for item in value:
            _wire_value(item, depth + 1)
        return
    if isinstance(value, dict):
        if len(value) > MAX_ENTRIES:
            raise ValueError(f"has a map of {len(value):,} entries; the limit is {MAX_ENTRIES}")
        for item in value.values():
            _wire_value(item, depth + 1)
        return
    raise ValueError(f"holds {_show(value)}, a {type(value).__name__}; settings are strings, numbers, booleans, "
                     "lists and tables, as the worker's identity reports them")


def _wire_map(value: dict[str, Any]) -> dict[str, Any]:
    _wire_value(value)
    return value


def _to_decimal(value: object) -> Decimal:
    # A TOML float is read as the shortest decimal that round-trips (repr), so `0.01` means exactly 1/100.
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValueError(f"must be a number such as 0.01 or the string \"0.01\"; got {_show(value)}")
    try:
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError):
        raise ValueError(f"must be a number such as 0.01 or the string \"0.01\"; got {_show(value)}") from None
    if not number.is_finite():
        raise ValueError(f"must be a finite number; got {_show(value)}")
    # Decimal arithmetic keeps 28 significant digits: more places would be rounded without a word, and a
    # hostile exponent (1E-999999999) would make the contract's text a gigabyte.
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite
    zeros = len(digits) - len(bytes(digits).rstrip(b"\x00")) if any(digits) else len(digits)
    if -(exponent + zeros) > MAX_PLACES:
        raise ValueError(f"has more than {MAX_PLACES} digits after the decimal point; round it to {MAX_PLACES} "
                         "or fewer")
    return number


def _open_unit(value: Decimal) -> Decimal:
    if not Decimal(0) < value < Decimal(1):
        raise ValueError(f"must be in (0, 1); got {_shown(value)}")
    return value


def _shown(value: Decimal) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:59] + '…'


def _non_negative(value: Decimal) -> Decimal:
    if value < 0:
        raise ValueError(f"must be 0 or more; got {value}")
    return value


def _decimal_text(value: Decimal) -> str:
    # One spelling per value, so equal contracts have equal digests: 0.010 and 1E-2 both become "0.01".
    return format(value.normalize(), "f")


Hex64 = Annotated[str, AfterValidator(_hex64)]
ShortText = Annotated[str, Field(max_length=MAX_TEXT)]
WireMap = Annotated[dict[str, Any], Field(max_length=MAX_ENTRIES), AfterValidator(_wire_map)]
Probability = Annotated[
    Decimal, BeforeValidator(_to_decimal), AfterValidator(_open_unit), PlainSerializer(_decimal_text, return_type=str)
]
LossAmount = Annotated[Decimal, BeforeValidator(_to_decimal), PlainSerializer(_decimal_text, return_type=str)]
"""An amount of task loss (ε): exact, written like a probability; its range follows the scorer's, so the model's
validators check it (`_check_epsilon`)."""
NonNegative = Annotated[
    Decimal, BeforeValidator(_to_decimal), AfterValidator(_non_negative),
    PlainSerializer(_decimal_text, return_type=str),
]
CaptureStep = Annotated[int | str, BeforeValidator(check_step)]
Scalar = str | int | float | bool

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True)
"""Strict: nothing the owner writes is coerced (`true` is not 1, `"16"` is not 16, `"yes"` is not true, 16.0 is not
16); an integer where a float is expected is the number it is. `invar.owner_files.field_error` says what to write."""


class _Model(BaseModel):
    model_config = _CONFIG


# --- sections shared by declaration and contract ------------------------------------------------------------------


class Scorer(_Model):
    """How one response is scored: a built-in scorer of the core (`invar.tasks.scorers.BUILTIN_SCORERS`) by name, or
    the owner's function as `path.py:function`, with its settings."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_PATH)]
    """A built-in scorer's name (`exact-match`, `numeric`, `regex`, `choice`, `contains`, `arithmetic-exact`), or
    `path.py:function`: a function in a file, the path relative to the declaration (in a contract: to the contract)."""
    settings: dict[ShortText, JsonValue] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    """Settings the scorer takes (docs/your-model.md lists each scorer's); empty for scorers that take none."""
    version: ShortText | None = None
    """The scorer's version as the contract fixes it (`use prepare` writes it; `arithmetic-exact` contracts, which
    predate versions, leave it out). A scorer of another version is refused at admission."""
    sha256: Hex64 | None = None
    """For a `path.py:function` scorer: sha256 of the file. `use prepare` pins it; `use admit` refuses a changed
    file. A declaration may state it to pin the file it means."""


class Sampling(_Model):
    """The request settings every generate call uses, identical for reference and candidate."""

    temperature: float = Field(ge=0.0, le=10.0)
    """Sampling temperature; the log-probabilities reported are at this temperature."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus mass kept before sampling; 1.0 keeps the whole distribution."""
    max_tokens: int = Field(ge=1, le=65536)
    """The most tokens a response may have, end-of-sequence included."""


class Requirement(_Model):
    """What must hold of the mean task-loss increase (candidate loss minus reference loss, per unit)."""

    standard: Literal["population", "finite-domain"]
    """`population`: a confidence bound over the declared population. `finite-domain`: the exact mean over
    the declared units, with no claim beyond them."""
    epsilon: LossAmount
    """ε: the largest allowed increase of the mean task loss, in loss units (a fraction of units for 0/1 loss): in
    (0, 1) for 0/1 losses, in (0, b − a) for a scorer whose losses lie in a declared [a, b]."""
    delta: Probability | None = None
    """δ: the allowed error probability of the bound (confidence 1 − δ); population standard only."""
    method: ShortText | None = None
    """The bound method (a key of `invar.stats.bounds.METHODS`; with `sequential`, of
    `invar.stats.sequential.SEQUENTIAL_METHODS`); population standard only."""
    sequential: bool | None = None
    """True: sequential admission (plan `invar.plan/4`). The pairing calls run look by look in the plan's order and
    the run stops at the first look where the anytime-valid bound decides, or at `max_n`. Omitted (or false): the
    fixed-n decision on every planned unit; the key is left out of the JSON, so older contracts keep their digest."""
    max_n: int | None = Field(default=None, ge=1, le=1 << 24)
    """The most units a sequential run uses: exactly the units the plan runs (`population.sample`, or the whole
    population). Sequential contracts only."""


class Layout(_Model):
    """A batch layout: how the planned requests are grouped into batches that run one after another."""

    batch_size: int = Field(ge=1, le=1 << 20)
    """Requests per batch; the last batch holds the remainder."""
    order: Literal["forward", "reverse", "shuffled"] = "forward"
    """The order requests are put into batches: as planned, reversed, or permuted by a seed derived from the
    contract seed and the layout's name."""


class Pairing(_Model):
    """Reference and candidate run the same units with the same per-unit seeds, all derived from `seed`."""

    seed: int = Field(ge=0, lt=1 << 63)
    """The contract seed: per-unit sampling seeds, the sample of units and shuffled layouts derive from it."""
    layout: Name
    """The layout (a key of `layouts`) both packages run for the paired comparison."""


class Invariance(_Model):
    """Whether the candidate must give bit-identical tokens and log-probabilities across batch layouts."""

    required: bool
    """If true, the candidate runs every listed layout and any bit of difference between them violates the
    contract. Layouts not listed are not covered; the reference is not required to be invariant."""
    layouts: list[Name] = Field(default_factory=list)
    """The layouts (keys of `layouts`) the candidate must be invariant across."""
    relative_to: Literal["reference"] | None = None
    """`reference`: judge the candidate's invariance against the reference's, for a candidate that changes a kernel
    of an engine that is not batch invariant itself. The reference runs every listed layout too, and the requirement
    is that the candidate adds no layout dependence, unit by unit: a unit whose reference outputs are bit-identical
    across the layouts must be bit-identical across them under the candidate. A unit the reference itself varies on
    is not covered (the decision counts them). Omitted: every unit of the candidate must be invariant, whatever the
    reference does (the key is left out of the JSON, so contracts without it keep their bytes)."""


class Determinism(_Model):
    """Whether the candidate must give bit-identical tokens and log-probabilities when one layout is run again."""

    required: bool
    """If true, the candidate runs `layout` `runs` times, each later run in a worker started afresh after the first
    run's calls (so no state the first run left in a process can answer the second), and any bit of difference on a
    unit between two runs violates the contract. Other layouts are not covered."""
    layout: Name | None = None
    """The layout (a key of `layouts`) run again: one the candidate runs for the pairing or for invariance."""
    runs: int = Field(default=2, ge=2, le=8)
    """How many times the candidate runs `layout` (the first run is the layout's own calls)."""
    relative_to: Literal["reference"] | None = None
    """`reference`: the reference runs `layout` again too, and a unit whose reference outputs differ between its runs
    is not counted against the candidate (the decision counts them). Omitted: every unit counts."""


class Execution(_Model):
    """How the plan cuts each layout's requests into calls (plan `invar.plan/2`)."""

    requests_per_call: int = Field(default=64, ge=1, le=1 << 20)
    """The most requests one generate call carries. A call holds whole batches of its layout (one batch at least,
    so a batch larger than this is one call), so batching is exactly the layout's; smaller calls mean finer
    progress and less work repeated when a killed run resumes."""


class Measurements(_Model):
    """Numerical measurements the plan adds (plan `invar.plan/3`): teacher forcing and whole-vocabulary captures.

    They are reported beside the decision and decide nothing, unless `max_kl` is set."""

    teacher_forcing: bool = True
    """The candidate scores the reference's sampled responses (of the pairing layout) step by step, on the
    reference's context, and the captures of both packages are taken along the reference's responses. False: each
    package scores its own responses and the captures are compared only within the prefix both responses share."""
    capture_steps: list[CaptureStep] = Field(default_factory=list, max_length=MAX_STEPS)
    """Steps with a whole-vocabulary capture from both packages: step numbers (0 is the first response token),
    "last", or "every:K". A step number past a unit's response is not captured for that unit."""
    units: int | None = Field(default=None, ge=1)
    """Measure only the first units of the pairing layout: its batches in order, whole, until at least this many
    units are covered. Omit to measure every unit."""
    max_kl: NonNegative | None = None
    """If set, a requirement: KL(reference ‖ candidate), in nats, at most this at every capture. A capture whose KL
    exceeds it by more than the KL's numerical error bound violates the contract; one within that bound of it
    leaves the decision Unknown."""

    @model_validator(mode="after")
    def _measures_something(self) -> Measurements:
        if not self.teacher_forcing and not self.capture_steps:
            raise ValueError("measurements: with teacher_forcing = false and no capture_steps nothing is measured; "
                             "add capture_steps or remove the section")
        if self.max_kl is not None and not self.capture_steps:
            raise ValueError("measurements.max_kl: KL is measured at the capture steps; add capture_steps")
        return self


class Adapter(_Model):
    """A LoRA adapter folder and its tree digest."""

    path: PathText
    """The adapter folder (relative to the declaration in a declaration, to the contract in a contract)."""
    digest: Hex64
    """`invar.canonical.tree_digest` of the folder."""


def _config_field(name: str) -> str:
    if name not in CONFIG_FIELDS:
        raise ValueError(f"{name!r} is not a field of the effective configuration; use one of "
                         f"{', '.join(CONFIG_FIELDS)}")
    return name


ConfigField = Annotated[str, AfterValidator(_config_field)]
"""A field of the effective configuration (`invar.formats.model_config.FIELDS`)."""


class KnownPremise(_Model):
    """A field of the effective configuration the package's engine does not compute as the model folder asks."""

    field: ConfigField
    """The field (`invar.formats.model_config.FIELDS`), e.g. `embed_scale` or `sliding_window`."""
    why: str = Field(min_length=1, max_length=MAX_STATEMENT)
    """Why the package is meant to run the model so, in one sentence (the package is about the engine as it is)."""


class ConfigChange(_Model):
    """One field of the effective configuration the candidate changes from the reference, as each folder gives it."""

    reference: JsonValue
    """The reference's value (its model folder's config.json read the transformers way)."""
    candidate: JsonValue
    """The candidate's value."""


class PackageDeclaration(_Model):
    """A frozen package: the worker that must answer and the model it must load."""

    engine: EngineName
    """The worker's engine, as its handshake identity names it."""
    engine_version: dict[ShortText, ShortText] = Field(max_length=MAX_ENTRIES)
    """The engine's package versions, exactly as the worker's identity reports them."""
    settings: WireMap = Field(default_factory=dict)
    """The worker's settings, exactly as its identity reports them (patches excluded, see `patches`). Those that are
    launch options of the engine's worker (`invar.engines.LAUNCH_SETTINGS`) must have the type and a value the
    worker takes; the others are only compared with the worker's identity at handshake."""
    patches: dict[ShortText, Hex64] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    """Patches applied to the package: name → sha256. The worker reports them in its settings as `patches`."""
    model_dir: PathText
    """The model folder (relative to the declaration in a declaration, to the contract in a contract)."""
    model_digest: Hex64
    """`invar.canonical.tree_digest` of the model folder."""
    dtype: Literal["float32", "bfloat16"]
    """The dtype the model is loaded in."""
    quantization: Literal["none", "nf4"] = "none"
    """The weight quantization the model is loaded with."""
    adapter: Adapter | None = None
    """The LoRA adapter loaded with the model, if any."""
    known_premises: list[KnownPremise] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """Fields of the effective configuration this package's engine does not honour, each with why: where the
    worker's effective configuration differs from the model folder's in such a field, the difference is a recorded
    premise of the package instead of a refusal. Omitted: none (the key is left out of a contract's JSON, so
    contracts without it keep their bytes)."""
    worker_digest: Hex64 | None = None
    """The worker code digest (`invar.worker_code`): the engine's worker module and every core module it imports,
    as a tree digest. `use run` computes it from the files it is about to start and refuses a mismatch before the
    worker exists; `use admit` compares it with each record's identity. In a declaration, omitted: `use prepare`
    fixes the digest of the worker code where it runs. In a contract, absent only in contracts prepared before
    worker code was pinned (the key is left out of their JSON, so they keep their digest); `use run` refuses those."""

    @field_validator("known_premises")
    @classmethod
    def _one_premise_per_field(cls, premises: list[KnownPremise]) -> list[KnownPremise]:
        fields = [p.field for p in premises]
        for name in fields:
            if fields.count(name) > 1:
                raise ValueError(f"field {name!r} is declared a known premise twice; keep one entry")
        return premises

    def premise_fields(self) -> tuple[str, ...]:
        """The effective-configuration fields this package declares its engine does not honour."""
        return tuple(p.field for p in self.known_premises)

    @field_validator("settings")
    @classmethod
    def _launch_options(cls, settings: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        engine = info.data.get("engine")  # absent when the engine itself was refused
        if isinstance(engine, str):
            check_launch_settings(engine, settings)
        return settings

    def expected_settings(self) -> dict[str, Any]:
        """The settings map the worker identity must report: `settings`, plus `patches` when any are declared."""
        if not self.patches:
            return dict(self.settings)
        return {**self.settings, "patches": dict(self.patches)}

    def load_params(self) -> dict[str, Any]:
        """The `load_model` parameters the package's worker must have been called with (paths as written)."""
        return {
            "model_dir": self.model_dir,
            "model_digest": self.model_digest,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "adapter": None if self.adapter is None else {"path": self.adapter.path, "digest": self.adapter.digest},
        }

    def anchor(self) -> dict[str, Any]:
        """Everything that identifies the package in a run's records; paths are excluded (they are hints)."""
        return {
            "engine": self.engine,
            "engine_version": dict(self.engine_version),
            "settings": self.expected_settings(),
            "model_digest": self.model_digest,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "adapter_digest": None if self.adapter is None else self.adapter.digest,
            "worker_digest": self.worker_digest,
        }


class Package(PackageDeclaration):
    """A package as the contract fixes it: the declaration plus the digest of its tokenizer files."""

    tokenizer_digest: Hex64
    """Digest of the tokenizer files ({name: sha256} of `tokenizer.json` and `tokenizer_config.json`), which the
    core reads to turn response tokens into text."""


class Premise(_Model):
    """An assumption the decision rests on, and who vouches for it."""

    statement: str = Field(min_length=1, max_length=MAX_STATEMENT)
    """What is assumed, in one sentence."""
    party: str = Field(min_length=1, max_length=MAX_TEXT)
    """Who vouches for it (a person, team or organisation)."""
    basis_sha256: Hex64
    """sha256 of the document or file the statement rests on."""
    reliance: Literal["vouched", "checked"]
    """`vouched`: the decision relies on the party's word; the core records the basis digest it cannot check.
    `checked`: the core re-hashes the basis file at every admission and relies on it only if it still matches."""
    basis_path: PathText | None = None
    """The basis file, for `checked` premises (relative to the declaration, then to the contract)."""

    @model_validator(mode="after")
    def _path_matches_reliance(self) -> Premise:
        if self.reliance == "checked" and self.basis_path is None:
            raise ValueError("a checked premise needs basis_path: the file whose sha256 is basis_sha256")
        if self.reliance == "vouched" and self.basis_path is not None:
            raise ValueError("a vouched premise has no basis_path; use reliance = \"checked\" to have it hashed")
        return self


# --- declaration -------------------------------------------------------------------------------------------------


class PopulationDeclaration(_Model):
    """The prompts the use is about, and which of them are run."""

    path: PathText
    """The population file, relative to the declaration."""
    sha256: Hex64
    """sha256 of the population file's bytes."""
    unit: Literal["prompt"] = "prompt"
    """What one unit of the population is; each unit gets one paired comparison."""
    sample: int | None = Field(default=None, ge=1)
    """Run a seeded sample of this many units; omit to run every unit."""


def _check_common(
    requirement: Requirement,
    pairing: Pairing,
    invariance: Invariance,
    layouts: Mapping[str, Layout],
    reference: PackageDeclaration,
    candidate: PackageDeclaration,
    determinism: Determinism | None = None,
) -> None:
    """Cross-field rules shared by a declaration and a contract; messages start with the field they name."""
    if requirement.standard == "population":
        if requirement.delta is None:
            raise ValueError("requirement.delta: the population standard needs δ (or confidence = 1 − δ); add it")
        if requirement.method is None:
            raise ValueError("requirement.method: the population standard needs a bound method; name one")
        _check_method(requirement.method, bool(requirement.sequential))
    else:
        if requirement.delta is not None:
            raise ValueError("requirement.delta: the finite-domain standard makes no confidence claim; remove it")
        if requirement.method is not None:
            raise ValueError("requirement.method: the finite-domain standard uses no bound; remove it")
    if requirement.sequential:
        if requirement.standard != "population":
            raise ValueError("requirement.sequential: the finite-domain standard decides on every declared unit; "
                             "remove sequential or use the population standard")
        if requirement.max_n is None:
            raise ValueError("requirement.max_n: sequential admission needs the most units a run may use; add it")
        if invariance.required:
            raise ValueError("requirement.sequential: a sequential run stops its pairing calls early, so it cannot "
                             "cover every unit under the invariance layouts; set invariance.required = false or "
                             "remove sequential")
    elif requirement.max_n is not None:
        raise ValueError("requirement.max_n: only a sequential contract has a maximum n; add sequential = true or "
                         "remove max_n")
    for name in layouts:
        check_name(name)
    if pairing.layout not in layouts:
        raise ValueError(
            f"pairing.layout: {pairing.layout!r} is not a key of layouts; define [layouts.{pairing.layout}]"
        )
    if invariance.required:
        if len(set(invariance.layouts)) < 2:
            raise ValueError("invariance.layouts: invariance needs at least two distinct layouts to compare; list them")
        if len(set(invariance.layouts)) != len(invariance.layouts):
            raise ValueError("invariance.layouts: a layout is listed twice; list each once")
        for name in invariance.layouts:
            if name not in layouts:
                raise ValueError(f"invariance.layouts: {name!r} is not a key of layouts; define [layouts.{name}]")
    elif invariance.layouts:
        raise ValueError("invariance.layouts: invariance is not required, so no layouts are compared; remove them")
    if invariance.relative_to is not None and not invariance.required:
        raise ValueError("invariance.relative_to: invariance is not required, so there is nothing to judge against the "
                         "reference; set invariance.required = true or remove relative_to")
    if determinism is not None:
        _check_determinism(determinism, requirement, pairing, invariance)
    used = {pairing.layout, *invariance.layouts}
    for name in layouts:
        if name not in used:
            raise ValueError(f"layouts.{name}: is used by neither pairing nor invariance; remove it")
    if reference.anchor() == candidate.anchor():
        raise ValueError("candidate: is identical to the reference package; a contract compares two packages")


def _check_determinism(determinism: Determinism, requirement: Requirement, pairing: Pairing,
                       invariance: Invariance) -> None:
    """The determinism section's layout is one the candidate runs anyway (and, relative to the reference, one the
    reference runs too), so its first run is that layout's own calls."""
    if not determinism.required:
        if determinism.layout is not None or determinism.relative_to is not None:
            raise ValueError("determinism: determinism is not required, so no layout is run again; set required = true "
                             "or remove layout and relative_to")
        return
    if requirement.sequential:
        raise ValueError("requirement.sequential: a sequential run stops its pairing calls early, so it cannot run "
                         "every unit again; remove the determinism section or sequential")
    if determinism.layout is None:
        raise ValueError(f"determinism.layout: name the layout run again, e.g. the pairing layout "
                         f"{pairing.layout!r}")
    candidate_runs = {pairing.layout, *invariance.layouts}
    if determinism.layout not in candidate_runs:
        raise ValueError(f"determinism.layout: {determinism.layout!r} is not a layout the candidate runs; name the "
                         f"pairing layout {pairing.layout!r} or an invariance layout")
    reference_runs = {pairing.layout, *(invariance.layouts if invariance.relative_to == "reference" else ())}
    if determinism.relative_to == "reference" and determinism.layout not in reference_runs:
        raise ValueError(f"determinism.layout: {determinism.layout!r} is not a layout the reference runs, which "
                         f"relative_to = \"reference\" needs; name the pairing layout {pairing.layout!r}")


def declared_loss_range(scorer: Scorer) -> tuple[float, float] | None:
    """The declared `loss_range = [a, b]` of a user scorer declared with `binary = false`; None for a 0/1 scorer
    (every built-in, or `binary = true`) and for settings the scorer refuses when loaded (`use prepare` names what
    is wrong with them then)."""
    path, sep, _ = scorer.name.rpartition(":")
    if not sep or not path.endswith(".py") or scorer.settings.get("binary", False) is not False:
        return None
    declared = scorer.settings.get("loss_range")
    if not isinstance(declared, list) or len(declared) != 2:
        return None
    low, high = declared
    if isinstance(low, bool) or isinstance(high, bool) or not isinstance(low, int | float) or \
            not isinstance(high, int | float):
        return None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        return None
    return float(low), float(high)


def loss_span(scorer: Scorer) -> Fraction | None:
    """b − a, exactly, of `declared_loss_range`; None for a 0/1 scorer."""
    declared = declared_loss_range(scorer)
    return None if declared is None else Fraction(declared[1]) - Fraction(declared[0])


def _check_epsilon(requirement: Requirement, scorer: Scorer) -> None:
    """ε lies in (0, 1) for 0/1 losses and in (0, b − a) for losses in [a, b]: an ε of b − a or more would admit
    any candidate."""
    span = loss_span(scorer)
    eps = requirement.epsilon
    if span is None:
        if not Decimal(0) < eps < Decimal(1):
            raise ValueError(f"requirement.epsilon: must be in (0, 1); got {_shown(eps)}")
    elif not 0 < Fraction(eps) < span:
        raise ValueError(f"requirement.epsilon: must be in (0, {float(span):g}) for losses in the scorer's "
                         f"loss_range (at most b − a); got {_shown(eps)}")


def _check_method(method: str, sequential: bool) -> None:
    if sequential:
        if method not in SEQUENTIAL_METHODS:
            raise ValueError(f"requirement.method: {_show(method)} is not a sequential method; with sequential = true "
                             f"use one of {', '.join(SEQUENTIAL_METHODS)}")
    elif method not in METHODS:
        hint = " (a sequential method: add sequential = true and max_n)" if method in SEQUENTIAL_METHODS else ""
        raise ValueError(f"requirement.method: unknown bound method {_show(method)}{hint}; use one of "
                         f"{', '.join(METHODS)}")


def _check_sequential(requirement: Requirement, measurements: Measurements | None) -> None:
    if requirement.sequential and measurements is not None:
        raise ValueError("requirement.sequential: measurements cover batches a sequential run may never reach; remove "
                         "the measurements section or sequential")


def confidence_to_delta(data: Any) -> Any:
    """A declaration's raw data with `requirement.confidence` turned into `delta`: owners think in confidence, a
    contract keeps δ. Either is accepted, never both (`ValueError` naming the field)."""
    if isinstance(data, dict) and isinstance(data.get("requirement"), dict):
        req = dict(data["requirement"])
        if "confidence" in req:
            if "delta" in req:
                raise ValueError("requirement: give confidence or delta, not both")
            try:
                confidence = _open_unit(_to_decimal(req.pop("confidence")))
            except ValueError as exc:
                raise ValueError(f"requirement.confidence: {exc}") from None
            req["delta"] = _decimal_text(Decimal(1) - confidence)
        data = {**data, "requirement": req}
    return data


class Declaration(_Model):
    """What an owner writes: the use, the requirement, the two packages and the premises."""

    name: Name
    """The contract's name; `prepare` writes `<name>.contract.json`."""
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    """What the use is, in the owner's words."""
    population: PopulationDeclaration
    """The prompts the use is about."""
    scorer: Scorer
    """How each response is scored."""
    sampling: Sampling
    """The request settings of every generate call."""
    requirement: Requirement
    """The allowed task-loss increase and the standard that decides it."""
    pairing: Pairing
    """The contract seed and the layout of the paired comparison."""
    layouts: dict[str, Layout] = Field(max_length=MAX_LAYOUTS)
    """Batch layouts by name; each must be used by pairing or invariance."""
    invariance: Invariance
    """Which layouts the candidate must be bit-identical across."""
    reference: PackageDeclaration
    """The package that is trusted."""
    candidate: PackageDeclaration
    """The package proposed to replace it."""
    premises: list[Premise] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """Assumptions the decision may rest on."""
    config_changes: list[ConfigField] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """Fields of the effective configuration the candidate is meant to change from the reference (the contract is
    about that change, e.g. `rope_theta` for a candidate that runs the model at another rotary base). `use prepare`
    compares the two model folders' configurations and refuses any other difference."""
    execution: Execution = Field(default_factory=Execution)
    """How the plan's calls are cut; the defaults suit most uses."""
    measurements: Measurements | None = None
    """Teacher forcing and captures the plan adds (plan `invar.plan/3`); omit for none."""
    determinism: Determinism | None = None
    """Which layout the candidate must give bit-identical outputs on when run again; omit for none."""

    @model_validator(mode="before")
    @classmethod
    def _confidence_to_delta(cls, data: Any) -> Any:
        return confidence_to_delta(data)

    @model_validator(mode="after")
    def _consistent(self) -> Declaration:
        _check_epsilon(self.requirement, self.scorer)
        _check_common(self.requirement, self.pairing, self.invariance, self.layouts, self.reference, self.candidate,
                      self.determinism)
        _check_sequential(self.requirement, self.measurements)
        return self


# --- contract ----------------------------------------------------------------------------------------------------


class Population(_Model):
    """The population as the contract fixes it."""

    path: PathText
    """The population file, relative to the contract file."""
    sha256: Hex64
    """sha256 of the population file's bytes."""
    size: int = Field(ge=1)
    """How many units the file holds."""
    unit: Literal["prompt"] = "prompt"
    """What one unit is."""
    sample: int | None = Field(default=None, ge=1)
    """The size of the seeded sample run, or None when every unit is run."""

    @model_validator(mode="after")
    def _sample_fits(self) -> Population:
        if self.sample is not None and self.sample > self.size:
            raise ValueError(f"population.sample: {self.sample} exceeds the {self.size} units of the file; lower it")
        return self


class Contract(_Model):
    """The canonical use contract: fixed before any data exists, named by the sha256 of its JSON."""

    contract_schema: Literal["invar.contract/1"] = Field(alias="schema", default="invar.contract/1")
    """The layout of this JSON."""
    name: Name
    """The contract's name (also its file name)."""
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    """What the use is, in the owner's words."""
    population: Population
    """The population file, its digest and size, and the sample run."""
    scorer: Scorer
    """How each response is scored."""
    sampling: Sampling
    """The request settings of every generate call."""
    requirement: Requirement
    """The allowed task-loss increase and the standard that decides it."""
    method_version: str | None = None
    """The version of the bound method's arithmetic the decision must use (population standard only)."""
    pairing: Pairing
    """The contract seed and the layout of the paired comparison."""
    layouts: dict[str, Layout] = Field(max_length=MAX_LAYOUTS)
    """Batch layouts by name."""
    invariance: Invariance
    """Which layouts the candidate must be bit-identical across."""
    reference: Package
    """The trusted package."""
    candidate: Package
    """The package proposed to replace it."""
    premises: list[Premise] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """Assumptions the decision rests on."""
    config_changes: dict[ConfigField, ConfigChange] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    """The fields of the effective configuration in which the candidate differs from the reference, each with both
    values, as `use prepare` found them in the two model folders (each folder's config.json read the transformers
    way); only the fields the declaration names as the contract's purpose. `use run` checks every worker's reported
    configuration against its folder's, so these are the values the two packages compute with. Empty: the two
    compute the same configuration (the key is left out of the JSON, so contracts without it keep their bytes)."""
    execution: Execution | None = None
    """How the plan's calls are cut. Absent in contracts of plan `invar.plan/1` (one call per package and layout);
    present, the plan is `invar.plan/2`."""
    measurements: Measurements | None = None
    """Teacher forcing and captures (plan `invar.plan/3`). Absent (the key is left out of the JSON, so contracts
    without it keep their bytes and digest), the plan has none."""
    determinism: Determinism | None = None
    """Which layout the candidate runs again, in a fresh worker, and must reproduce bit for bit. Absent (the key is
    left out of the JSON, so contracts without it keep their bytes and digest), nothing is run again."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              strict=True)

    @model_validator(mode="after")
    def _consistent(self) -> Contract:
        _check_epsilon(self.requirement, self.scorer)
        _check_common(self.requirement, self.pairing, self.invariance, self.layouts, self.reference, self.candidate,
                      self.determinism)
        if (self.requirement.standard == "population") != (self.method_version is not None):
            raise ValueError("method_version: present exactly when the standard is population; re-run use prepare")
        if self.measurements is not None and self.execution is None:
            raise ValueError("measurements: need the execution section of plan invar.plan/2; re-run use prepare")
        _check_sequential(self.requirement, self.measurements)
        if self.requirement.sequential and self.execution is None:
            raise ValueError("requirement.sequential: needs the execution section (its calls are the looks); re-run "
                             "use prepare")
        return self

    def package(self, role: Literal["reference", "candidate"]) -> Package:
        """The reference or the candidate package."""
        return self.reference if role == "reference" else self.candidate

    def canonical_json(self) -> bytes:
        """The contract's canonical bytes: sorted keys, no insignificant whitespace, UTF-8, one final newline."""
        data = self.model_dump(mode="json", by_alias=True)
        if data["measurements"] is None:
            del data["measurements"]  # contracts prepared before measurements existed keep their bytes
        if data["determinism"] is None:
            del data["determinism"]  # and before determinism
        elif data["determinism"]["relative_to"] is None:
            del data["determinism"]["relative_to"]
        if data["invariance"]["relative_to"] is None:  # and before invariance relative to the reference
            del data["invariance"]["relative_to"]
        for key in ("sequential", "max_n"):  # likewise for contracts prepared before sequential admission
            if not data["requirement"][key]:
                del data["requirement"][key]
        for key in ("version", "sha256"):  # and for contracts of the arithmetic scorer, prepared before both
            if data["scorer"][key] is None:
                del data["scorer"][key]
        for role in ("reference", "candidate"):  # and for contracts prepared before worker code was pinned
            if data[role]["worker_digest"] is None:
                del data[role]["worker_digest"]
            if not data[role]["known_premises"]:  # and before effective configurations were compared
                del data[role]["known_premises"]
        if not data["config_changes"]:
            del data["config_changes"]
        return (json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()

    def sha256(self) -> str:
        """The contract's name for every later step: sha256 of `canonical_json()`."""
        return canonical.sha256(self.canonical_json())


# --- reading and writing ------------------------------------------------------------------------------------------


def _too_deep(source: str, what: str) -> ContractError:
    if what == "contract":
        return ContractError(f"{source}: objects and arrays nest more than {MAX_NESTING} levels deep; give the file "
                             "use prepare wrote")
    return ContractError(f"{source}: tables and arrays nest more than {MAX_NESTING} levels deep, where a declaration "
                         "needs about four: flatten it")


def _check_nesting(data: Any, source: str, what: str) -> None:
    """Refuse data nested deeper than MAX_NESTING before anything recursive (validation, JSON output) walks it."""
    level = [data]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_NESTING:
            raise _too_deep(source, what)
        below: list[Any] = []
        for node in level:
            below += [c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, dict | list)]
        level = below


def _unreadable_number(source: str, language: str) -> ContractError:
    # Python refuses to read integers longer than this (int_max_str_digits); nothing here needs one.
    return ContractError(f"{source}: not valid {language}: a number has more than {sys.get_int_max_str_digits():,} "
                         "digits; shorten it")


def parse_declaration(data: Mapping[str, Any], source: str = "declaration") -> Declaration:
    """Validate a declaration's data (as read from TOML); raises `ContractError` naming the field at fault."""
    _check_nesting(dict(data), source, "declaration")
    try:
        return Declaration.model_validate(dict(data))
    except ValidationError as exc:
        raise field_error(exc, source) from None


def read_declaration(path: str | os.PathLike[str]) -> Declaration:
    """Read and validate a TOML declaration file."""
    p = Path(path)
    text = read_owner_file(p, "declaration")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"{p}: not valid TOML ({exc}); fix the syntax") from None
    except RecursionError:  # the parser recurses once per nested array or inline table
        raise _too_deep(str(p), "declaration") from None
    except ValueError:
        raise _unreadable_number(str(p), "TOML") from None
    return parse_declaration(data, str(p))


def parse_contract(data: bytes, source: str = "contract") -> Contract:
    """Validate a contract's JSON bytes; raises `ContractError` naming the field at fault."""
    text = owner_text(data, source, "contract")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(f"{source}: not valid JSON ({exc}); give the file use prepare wrote") from None
    except RecursionError:
        raise _too_deep(source, "contract") from None
    except ValueError:
        raise _unreadable_number(source, "JSON") from None
    if not isinstance(obj, dict):
        raise ContractError(f"{source}: a contract is a JSON object; give the file use prepare wrote")
    _check_nesting(obj, source, "contract")
    if obj.get("schema") != CONTRACT_SCHEMA:
        raise ContractError(
            f"{source}: " + ("it states no schema" if obj.get("schema") is None else
                             f"schema is {_show(obj.get('schema'))}")
            + f", this Invar reads {CONTRACT_SCHEMA!r}; re-run use prepare"
        )
    try:
        return Contract.model_validate(obj)
    except ValidationError as exc:
        raise field_error(exc, source) from None


def read_contract(path: str | os.PathLike[str]) -> tuple[Contract, str]:
    """Read a contract file; returns the contract and the sha256 of the file's bytes.

    The digest is of the bytes as they are on disk, and they must be the contract's canonical form, so a
    hand-edited contract is refused rather than silently given a new name.
    """
    p = Path(path)
    raw = read_owner_file(p, "contract").encode()  # UTF-8 checked; these are the file's exact bytes again
    contract = parse_contract(raw, str(p))
    if contract.canonical_json() != raw:
        raise ContractError(f"{p}: the file is not in canonical form (edited by hand?); re-run use prepare")
    return contract, canonical.sha256(raw)
