"""`invar use init`: write a complete declaration from a model folder (or two), an engine per side, a population and a
scorer.

Every digest is computed here (population, model folders, patches, a user scorer's file) and each package's
`engine_version` and `settings` are the identity its worker reports, so `use prepare` accepts the file as written.
Paths are written relative to the declaration's folder, so the folder moves with what it names. The options make
the declaration's model (`invar.contract.model.Declaration`), and the file is written from it
(`invar.contract.declaration_toml`). Nothing is written until the whole declaration has passed the checks
`use prepare` makes.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from invar.cli.groups import grouped
from invar.cli.options import MaxTokensOpt, PopulationOpt, ScorerOpt, ScorerSettingOpt, TemperatureOpt, TopPOpt
from invar.engines import DEFAULT_MODEL, Dtype, Engine, Quantization, parse_launch_settings, worker_digest
from invar.errors import ContractError, InvarError, one_line
from invar.home import HOME

# The canonical codec, the patches and the runner (numpy, the worker transport) are imported where they are used:
# `use --help` and every other `use` command import this module at their start.

# The contract model, the plan, the scorers and the tokenizer are imported where they are used: `use --help` and
# each `use` command's --help read none of them (tests/cli/test_version.py).
ARITHMETIC = "arithmetic-exact"
"""The shipped scorer's name (`invar.tasks.arithmetic.SCORER_NAME`, which imports the task package), the default of
--scorer."""
DEFAULT_POPULATION = HOME / "data" / "arith-eval.jsonl"
DEFAULT_SAMPLE = 2000
"""As the shipped contracts: 2,000 sampled units (the whole population when it has fewer)."""
DEFAULT_SEED = 20261130
KERNEL_MAX_KL = "0.0001"
"""The `max_kl` (nats, at every capture) a kernel contract proposes: a float32 kernel that only reorders its sums
stays below 1e-9 on the shipped model, a matrix product silently run in bfloat16 reaches 1e-2
(docs/kernel-contracts.md)."""
KERNEL_CAPTURE_STEPS = ("every:1",)
"""The capture steps a kernel contract proposes: every response step of the reference's responses."""

_OPTION_OF = {
    # A field the declaration model refuses, and the option of `use init` that set it.
    "name": "--name", "description": "--description", "population.sample": "--sample", "scorer": "--scorer",
    "sampling.temperature": "--temperature", "sampling.top_p": "--top-p", "sampling.max_tokens": "--max-tokens",
    "requirement.epsilon": "--epsilon", "requirement.confidence": "--confidence", "requirement.delta": "--confidence",
    "requirement.method": "--method", "requirement.max_n": "--sample", "pairing.seed": "--seed",
    "layouts": "--batch-size", "execution.requests_per_call": "--requests-per-call",
    "invariance.relative_to": "--invariance-relative-to", "measurements.max_kl": "--max-kl",
    "measurements.capture_steps": "--capture-step", "measurements": "--measurements", "determinism": "--determinism",
    "reference.settings": "--setting", "candidate.settings": "--candidate-setting", "premises": "--party",
    "candidate": "--candidate-model, --candidate-engine, --candidate-setting, --candidate-patch, --candidate-dtype or "
                 "--candidate-quantization",
}


@dataclass
class _Side:
    """What one package states, before and after its worker was asked for its identity."""

    role: str
    engine: Engine
    model: Path
    launch: dict[str, Any]
    patches: dict[str, str]
    dtype: Dtype
    quantization: Quantization
    model_digest: str = ""
    tokenizer_digest: str = ""
    worker_digest: str = ""
    engine_version: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def _rel(target: Path, start: Path) -> str:
    """`target` relative to the declaration's folder, with forward slashes."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def _model(option: str, folder: Path) -> tuple[str, str]:
    """A model folder's tree digest and tokenizer digest, after the core has read its tokenizer."""
    from invar import canonical
    from invar.formats.tokenizer import ModelTokenizer, tokenizer_digest

    if not (folder / "config.json").is_file():
        raise ContractError(f"{option} {folder}: no config.json there; name a model folder (config.json, weights and "
                            "tokenizer files)")
    try:
        ModelTokenizer.from_model_dir(folder)
    except ContractError as exc:
        raise ContractError(f"{option} {folder}: {exc}") from None
    return canonical.tree_digest(folder), tokenizer_digest(folder)


def _patches(option: str, names: list[str], engine: Engine, base: Path) -> dict[str, str]:
    """Each patch or kernel `option` names (a name under patches/, or a folder, keyed relative to `base`): its
    digest."""
    from invar.patches import select

    return select(names, engine.value, option, base)[0]


@dataclass
class _Choices:
    """Everything the options decide, as the declaration will state it."""

    name: str
    description: str
    population: Path
    population_sha256: str
    sample: int | None
    scorer: str
    scorer_sha256: str | None
    scorer_settings: dict[str, Any]
    binary: bool
    temperature: float
    top_p: float
    max_tokens: int
    standard: str
    epsilon: str
    confidence: str
    method: str | None
    sequential: bool
    seed: int
    batch_size: int
    invariance: bool
    requests_per_call: int
    party: str | None
    relative_invariance: bool = False
    """Invariance relative to the reference (`invariance.relative_to = "reference"`)."""
    measurements: dict[str, Any] | None = None
    """The `[measurements]` section as the contract model reads it (teacher_forcing, capture_steps, max_kl), or
    None for none."""
    determinism: bool = False
    """Write `[determinism]`: the candidate runs the pairing layout twice, relative to the reference."""


def _package(side: _Side, base: Path) -> dict[str, Any]:
    return {"engine": side.engine.value, "engine_version": side.engine_version, "settings": side.settings,
            "worker_digest": side.worker_digest, **({"patches": side.patches} if side.patches else {}),
            "model_dir": _rel(side.model, base), "model_digest": side.model_digest, "dtype": side.dtype.value,
            "quantization": side.quantization.value}


def _declaration(c: _Choices, reference: _Side, candidate: _Side, base: Path) -> dict[str, Any]:
    """The declaration the choices make, as its TOML states it (the model reads it: `_declared`)."""
    pairing = f"b{c.batch_size}"
    requirement: dict[str, Any] = {"standard": c.standard, "epsilon": c.epsilon}
    if c.standard == "population":
        requirement |= {"confidence": c.confidence, "method": c.method}
        if c.sequential:
            requirement |= {"sequential": True, "max_n": c.sample}
    layouts: dict[str, Any] = {pairing: {"batch_size": c.batch_size}}
    invariance: dict[str, Any] = {"required": c.invariance}
    if c.invariance:
        layouts |= {f"b{2 * c.batch_size}-shuffled": {"batch_size": 2 * c.batch_size, "order": "shuffled"},
                    "solo": {"batch_size": 1}}
        invariance |= {**({"relative_to": "reference"} if c.relative_invariance else {}), "layouts": list(layouts)}
    return {
        "name": c.name, "description": c.description,
        "population": {"path": _rel(c.population, base), "sha256": c.population_sha256, "unit": "prompt",
                       **({} if c.sample is None else {"sample": c.sample})},
        "scorer": {"name": c.scorer, **({} if c.scorer_sha256 is None else {"sha256": c.scorer_sha256}),
                   **({"settings": c.scorer_settings} if c.scorer_settings else {})},
        "sampling": {"temperature": c.temperature, "top_p": c.top_p, "max_tokens": c.max_tokens},
        "requirement": requirement, "pairing": {"seed": c.seed, "layout": pairing}, "layouts": layouts,
        "invariance": invariance, **({} if c.measurements is None else {"measurements": c.measurements}),
        **({"determinism": {"required": True, "layout": pairing, "runs": 2, "relative_to": "reference"}}
           if c.determinism else {}),
        "execution": {"requests_per_call": c.requests_per_call},
        "reference": _package(reference, base), "candidate": _package(candidate, base),
        "premises": [] if c.party is None else [{
            "statement": "The population represents the prompts the model will be asked in this use.",
            "party": c.party, "basis_sha256": c.population_sha256, "reliance": "vouched"}],
    }


def _render(c: _Choices, reference: _Side, candidate: _Side, base: Path, out: Path) -> str:
    """The declaration's text, written from its model (`invar.contract.declaration_toml`); a field the model refuses
    is one line naming the option that set it."""
    from invar.contract.declaration_toml import declaration_toml
    from invar.contract.model import parse_declaration

    with _refusal(out):
        declaration = parse_declaration(_declaration(c, reference, candidate, base), str(out))
    return declaration_toml(declaration, out.name, {"reference": reference.tokenizer_digest,
                                                    "candidate": candidate.tokenizer_digest})


@contextmanager
def _refusal(out: Path) -> Iterator[None]:
    """A refusal of the declaration as one line naming the option that set the refused field."""
    try:
        yield
    except InvarError as exc:
        message = str(exc).removeprefix(f"{one_line(str(out))}: ")  # as the error wrote the path: escaped
        field_name = next((f for f in sorted(_OPTION_OF, key=len, reverse=True) if message.startswith(f)), None)
        hint = "" if field_name is None else f" (set by {_OPTION_OF[field_name]})"
        raise type(exc)(f"use init: {message}{hint}; nothing was written to {out}") from None


def _check(text: str, out: Path) -> None:
    """The checks `use prepare` makes on the text as written, without writing a contract: one line naming the option
    that set a refused field."""
    from invar import canonical
    from invar.contract.model import parse_declaration
    from invar.contract.plan import derive_plan
    from invar.contract.prepare import build_contract, model_folders, package_tokenizers, prompt_encoders

    with _refusal(out):
        declaration = parse_declaration(tomllib.loads(text), str(out))
        base = out.parent
        contract, units = build_contract(declaration, base, base)
        encoders = prompt_encoders(package_tokenizers(contract, model_folders(contract, base)))
        derive_plan(contract, canonical.sha256(contract.canonical_json()), units, encoders)


@dataclass(frozen=True)
class PackageOptions:
    """The two packages the declaration pins: each side's model folder, engine, launch settings, patches, dtype and
    weight quantization (the candidate's default to the reference's)."""

    model: Annotated[Path, typer.Option("--model", help="The reference's model folder.")] = DEFAULT_MODEL
    candidate_model: Annotated[
        Path | None, typer.Option("--candidate-model", help="The candidate's model folder (default: --model).")
    ] = None
    engine: Annotated[Engine, typer.Option("--engine", help="The reference's engine.")] = Engine.HF
    candidate_engine: Annotated[
        Engine | None, typer.Option("--candidate-engine", help="The candidate's engine (default: --engine).")
    ] = None
    setting: Annotated[
        list[str] | None, typer.Option("--setting", metavar="NAME=VALUE", help="A launch setting of the reference's "
                                       "worker (repeatable; checked before it starts).")
    ] = None
    candidate_setting: Annotated[
        list[str] | None, typer.Option("--candidate-setting", metavar="NAME=VALUE", help="A launch setting of the "
                                       "candidate's worker (repeatable; default: --setting when the engines are the "
                                       "same).")
    ] = None
    patch: Annotated[
        list[str] | None, typer.Option("--patch", metavar="NAME|PATH", help="A patch or kernel the reference runs "
                                       "with: a name under INVAR_HOME's patches/, or a folder path.")
    ] = None
    candidate_patch: Annotated[
        list[str] | None, typer.Option("--candidate-patch", metavar="NAME|PATH", help="A patch or kernel the "
                                       "candidate runs with (repeatable): a name under INVAR_HOME's patches/ (e.g. "
                                       "fixed-block), or a folder path (e.g. ./my-kernel).")
    ] = None
    dtype: Annotated[Dtype, typer.Option("--dtype", help="The reference's dtype.")] = Dtype.FLOAT32
    candidate_dtype: Annotated[
        Dtype | None, typer.Option("--candidate-dtype", help="The candidate's dtype (default: --dtype).")
    ] = None
    quantization: Annotated[
        Quantization, typer.Option("--quantization", help="The reference's weight quantization.")
    ] = Quantization.NONE
    candidate_quantization: Annotated[
        Quantization | None, typer.Option("--candidate-quantization", help="The candidate's weight quantization "
                                                                           "(default: --quantization), e.g. nf4.")
    ] = None


@dataclass(frozen=True)
class TaskOptions:
    """The task: the population, its scorer, and how each response is sampled."""

    population: PopulationOpt = DEFAULT_POPULATION
    scorer: ScorerOpt = ARITHMETIC
    scorer_setting: ScorerSettingOpt = None
    temperature: TemperatureOpt = 1.0
    top_p: TopPOpt = 1.0
    max_tokens: MaxTokensOpt = 5


@dataclass(frozen=True)
class RequirementOptions:
    """The requirement and how it is decided: the standard, ε and the confidence, the bound method, sequential or
    fixed, and which units run."""

    standard: Annotated[
        str, typer.Option("--standard", help="population (a confidence bound) or finite-domain (exact on the "
                                             "declared units).")
    ] = "population"
    epsilon: Annotated[
        str, typer.Option("--epsilon", help="ε: the largest allowed rise of the mean task loss, a decimal.")
    ] = "0.01"
    confidence: Annotated[str, typer.Option("--confidence", help="1 − δ, a decimal.")] = "0.95"
    method: Annotated[
        str | None, typer.Option("--method", help="The bound method (default: paired-binary-score for 0/1 losses, "
                                                  "maurer-pontil otherwise; sequential: the *-sequence one).")
    ] = None
    sequential: Annotated[
        bool, typer.Option("--sequential", help="Decide sequentially: stop as soon as the bound decides.")
    ] = False
    sample: Annotated[
        int | None, typer.Option("--sample", help=f"Run a seeded sample of this many units (default "
                                                  f"{DEFAULT_SAMPLE:,}, or every unit of a smaller population).")
    ] = None
    every_unit: Annotated[bool, typer.Option("--every-unit", help="Run every unit of the population.")] = False
    seed: Annotated[int, typer.Option("--seed", help="The contract seed.")] = DEFAULT_SEED


@dataclass(frozen=True)
class CheckOptions:
    """The checks beside the task bound: the pairing layout, invariance, determinism and the measurements, and how
    many requests a call carries."""

    batch_size: Annotated[int, typer.Option("--batch-size", help="The pairing layout's batch size.")] = 16
    invariance: Annotated[
        bool | None, typer.Option("--invariance/--no-invariance",
                                  help="Require the candidate bit-identical alone, in batches of --batch-size and "
                                       "in shuffled batches of twice that (default: yes; no when sequential, and no "
                                       "for a kernel, which is judged by determinism: add --invariance where the use "
                                       "needs batch invariance).")
    ] = None
    determinism: Annotated[
        bool | None, typer.Option("--determinism/--no-determinism",
                                  help="Require the candidate to reproduce the pairing layout bit for bit when run "
                                       "again in a fresh worker, relative to the reference (default: yes when only "
                                       "the candidate runs patches, and not sequential).")
    ] = None
    requests_per_call: Annotated[
        int, typer.Option("--requests-per-call", help="The most requests one worker call carries.")
    ] = 64
    invariance_relative_to: Annotated[
        str | None, typer.Option("--invariance-relative-to", metavar="reference|none",
                                 help="reference: the candidate may add no layout dependence the reference lacks "
                                      "(the reference runs the layouts too); none: the candidate must be invariant "
                                      "on every unit (default: reference when only the candidate runs patches)")
    ] = None
    use_base: Annotated[
        bool, typer.Option("--base/--no-base",
                           help="With patches on the candidate alone and invariance required: run the "
                                "batch-invariant base (patches/invariant-*) on both sides, the candidate without the "
                                "ops its kernel replaces, so invariance judges only the kernel (default: yes where "
                                "the base can route; --no-base keeps the stock engine as the reference).")
    ] = True
    measurements: Annotated[
        bool | None, typer.Option("--measurements/--no-measurements",
                                  help="Write [measurements]: teacher forcing and whole-vocabulary captures "
                                       "(default: yes when only the candidate runs patches, and not sequential).")
    ] = None
    capture_step: Annotated[
        list[str] | None, typer.Option("--capture-step", metavar="STEP", help="A capture step of [measurements] "
                                       "(repeatable): a step number, last, or every:K (default: every:1).")
    ] = None
    max_kl: Annotated[
        str | None, typer.Option("--max-kl", metavar="NATS", help="Require KL(reference ‖ candidate) at most this "
                                 f"at every capture (default with patches: {KERNEL_MAX_KL}; 'none' for no bound).")
    ] = None


@dataclass(frozen=True)
class WrittenOptions:
    """What the file says of itself, and whether it may replace one."""

    name: Annotated[str | None, typer.Option("--name", help="The contract's name (default: the file's stem).")] = None
    description: Annotated[str | None, typer.Option("--description", help="The use, in your words.")] = None
    party: Annotated[
        str | None, typer.Option("--party", help="Who vouches that the population represents the use: writes "
                                                 "that premise.")
    ] = None
    add_end_ids: Annotated[
        bool, typer.Option("--add-end-ids", help="Where a model folder's chat template ends a turn with a token its "
                                                 "generation_config.json does not list among the ids that end a "
                                                 "response, add it there (and say so) before the folder is pinned.")
    ] = False
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False


@grouped
def init_cmd(
    out: Annotated[Path, typer.Argument(metavar="OUT.toml", help="The declaration to write (TOML); never "
                                                                 "overwritten without --force.")],
    packages: PackageOptions,
    task: TaskOptions,
    requirement: RequirementOptions,
    checks: CheckOptions,
    written: WrittenOptions,
) -> None:
    """Write a complete declaration: every digest filled in, each package's identity as its worker reports it.

    `use prepare` accepts the file as written. Every option is checked, and the declaration as a whole goes through
    prepare's checks, before anything is written; a worker is started once per distinct package identity.
    """
    from invar import canonical
    from invar.runner.engine import probe_identity

    if out.exists() and not written.force:
        raise InvarError(f"{out} exists; choose another path, or add --force to overwrite it")
    if out.exists() and not out.is_file():
        raise InvarError(f"{out} is not a file; choose a path for the declaration")
    if not out.parent.is_dir():
        raise InvarError(f"{out.parent} is no folder; create it, or choose a path in an existing folder")
    if requirement.standard not in ("population", "finite-domain"):
        raise InvarError(f"--standard {requirement.standard!r}: write population or finite-domain")
    if requirement.sequential and requirement.standard != "population":
        raise InvarError("--sequential decides with a confidence bound: it needs --standard population")
    if requirement.sequential and checks.invariance:
        raise InvarError("--sequential stops early and cannot cover every unit under other layouts: leave out "
                         "--invariance")
    if requirement.every_unit and requirement.sample is not None:
        raise InvarError("--every-unit and --sample both say how many units to run; give one")
    if checks.invariance_relative_to not in (None, "reference", "none"):
        raise InvarError(f"--invariance-relative-to {checks.invariance_relative_to!r}: write reference or none")
    if checks.determinism and requirement.sequential:
        raise InvarError("--determinism runs every unit again, which a sequential run may never reach: leave out "
                         "--sequential or --determinism")
    if checks.measurements and requirement.sequential:
        raise InvarError("--measurements covers batches a sequential run may never reach: leave out --sequential or "
                         "--measurements")
    from invar.cli.evaluate import _settings as scorer_settings
    from invar.stats.bounds import DEFAULT_BINARY_METHOD
    from invar.tasks.scorers import UserScorer, load_scorer

    base = out.parent
    scorer_values = scorer_settings(task.scorer_setting or [])
    c_engine = packages.candidate_engine or packages.engine
    ref_launch = parse_launch_settings(packages.engine.value, packages.setting or [])
    # The candidate's launch defaults to the reference's on the same engine (a change of kernels keeps the threads).
    same = packages.candidate_setting is None and c_engine == packages.engine
    cand_launch = dict(ref_launch) if same else parse_launch_settings(c_engine.value, packages.candidate_setting or [])
    sides = [_Side("reference", packages.engine, packages.model, ref_launch,
                   _patches("--patch", packages.patch or [], packages.engine, base), packages.dtype,
                   packages.quantization),
             _Side("candidate", c_engine, packages.candidate_model or packages.model, cand_launch,
                   _patches("--candidate-patch", packages.candidate_patch or [], c_engine, base),
                   packages.candidate_dtype or packages.dtype,
                   packages.candidate_quantization or packages.quantization)]
    if written.add_end_ids:
        _add_end_ids(sides)
    for side, option in zip(sides, ("--model", "--candidate-model"), strict=True):
        side.model_digest, side.tokenizer_digest = _model(option, side.model)
        side.worker_digest = worker_digest(side.engine.value)
    if not task.population.is_file():
        raise InvarError(f"--population {task.population}: no such file; name the population (JSON lines)")
    population_sha256 = canonical.file_sha256(task.population)
    # A user scorer's file is named relative to where `use init` runs, then written relative to the declaration.
    try:
        loaded = load_scorer(task.scorer, scorer_values, Path.cwd())
    except ContractError as exc:
        raise ContractError(f"--scorer {task.scorer}: {exc}") from None
    scorer_name, scorer_sha256 = task.scorer, None
    if isinstance(loaded, UserScorer):
        file_part, _, function = task.scorer.rpartition(":")
        scorer_name, scorer_sha256 = f"{_rel(Path(file_part), base)}:{function}", loaded.sha256
    method = requirement.method
    if method is None and requirement.standard == "population":
        if requirement.sequential:
            method = "paired-binary-sequence" if loaded.binary else "betting-sequence"
        else:
            method = DEFAULT_BINARY_METHOD if loaded.binary else "maurer-pontil"
    # A kernel contract (patches on the candidate alone) judges the kernel, not the engine around it: the task bound,
    # the measurements that see a precision the task cannot, and determinism (run to run, relative to the stock
    # reference). Batch invariance is a property some uses need, not correctness: a correct kernel may reduce in an
    # order that follows the batch's shape, so it is required only when asked for (--invariance).
    kernel = bool(sides[1].patches) and not sides[0].patches
    relative = checks.invariance_relative_to == "reference" if checks.invariance_relative_to is not None else kernel
    measured = checks.measurements if checks.measurements is not None else kernel and not requirement.sequential
    measure = None
    if measured:
        bound = checks.max_kl if checks.max_kl is not None else KERNEL_MAX_KL if kernel else None
        steps = [int(step) if step.isdecimal() else step for step in checks.capture_step or KERNEL_CAPTURE_STEPS]
        measure = {"teacher_forcing": True, "capture_steps": steps,
                   **({} if bound is None or bound == "none" else {"max_kl": bound})}
    elif checks.max_kl is not None or checks.capture_step:
        raise InvarError("--max-kl and --capture-step set [measurements], which is not written: add --measurements")
    units = sum(1 for line in task.population.read_bytes().splitlines() if line.strip())
    chosen = None if requirement.every_unit else requirement.sample if requirement.sample is not None else \
        DEFAULT_SAMPLE if units > DEFAULT_SAMPLE else None
    if requirement.sequential and chosen is None:
        chosen = units  # max_n must state the units the plan runs
    # Naming how invariance is judged (--invariance-relative-to) asks for it.
    invariant = bool(checks.invariance) if checks.invariance is not None else \
        not requirement.sequential and (not kernel or checks.invariance_relative_to is not None)
    determined = checks.determinism if checks.determinism is not None else kernel and not requirement.sequential
    why = ""
    if kernel and written.description is None:
        why = (" Judged by the task bound, max_kl on teacher-forced captures" if measured else
               " Judged by the task bound") + \
            (" and determinism (the pairing layout run twice, bit-identical)" if determined else "") + \
            ("; batch invariance is required too (--invariance)." if invariant else
             "; batch invariance is not required, as a correct kernel may be batch variant (use init --invariance "
             "adds it).")
    choices = _Choices(
        name=written.name if written.name is not None else out.stem.lower(),
        description=written.description if written.description is not None else
        f"May {_describe(sides[1])} replace {_describe(sides[0])} for this use?{why}",
        population=task.population, population_sha256=population_sha256, sample=chosen, scorer=scorer_name,
        scorer_sha256=scorer_sha256, scorer_settings=scorer_values, binary=loaded.binary, temperature=task.temperature,
        top_p=task.top_p, max_tokens=task.max_tokens, standard=requirement.standard, epsilon=requirement.epsilon,
        confidence=requirement.confidence, method=method, sequential=requirement.sequential, seed=requirement.seed,
        batch_size=checks.batch_size,
        invariance=invariant, requests_per_call=checks.requests_per_call, party=written.party, measurements=measure,
        determinism=determined)
    choices.relative_invariance = relative and choices.invariance
    if relative and checks.invariance_relative_to is not None and not choices.invariance:
        raise InvarError("--invariance-relative-to reference judges invariance, which is not required: leave out "
                         "--no-invariance or --invariance-relative-to")
    if kernel and choices.invariance and checks.use_base:
        _add_base(sides, base)
    for side in sides:  # everything but the identities first: a mistake costs no worker start
        side.engine_version, side.settings = {"invar": "0"}, dict(side.launch)
    _check(_render(choices, sides[0], sides[1], base, out), out)
    identities: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
    for side in sides:
        key = json.dumps([side.engine.value, side.launch, side.patches], sort_keys=True)
        if key not in identities:
            identity = probe_identity(side.engine, side.launch, side.patches,
                                      {k: str(base / k) for k in side.patches if "/" in k})
            identities[key] = (dict(identity.engine_version),
                               {k: v for k, v in identity.settings.items() if k != "patches"})
        side.engine_version, side.settings = identities[key]
    _same_attention(sides, identities)
    text = _render(choices, sides[0], sides[1], base, out)
    _check(text, out)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvarError(f"{out}: cannot write the declaration ({exc.strerror or exc}); choose another path") \
            from None
    typer.echo(f"wrote {out}: {choices.name}, {_describe(sides[1])} against {_describe(sides[0])}")
    if kernel:
        typer.echo("a kernel contract: " + ", ".join(
            ["the task bound", *(["max_kl"] if measure is not None and "max_kl" in measure else []),
             *(["determinism (the pairing layout run twice)"] if choices.determinism else []),
             *(["batch invariance"] if choices.invariance else [])])
                   + ("" if choices.invariance else "; batch invariance is not required (--invariance adds it)"))
    typer.echo(f"next: invar use prepare {out}")


def _same_attention(sides: list[_Side], identities: dict[str, tuple[dict[str, str], dict[str, Any]]]) -> None:
    """A kernel candidate's worker may run another attention implementation than the stock default (a patch needs
    eager attention): where the reference's was not chosen, it runs the candidate's, so the two packages differ in
    the kernel alone. The reference's worker is asked for its identity again with that setting."""
    from invar.runner.engine import probe_identity

    reference, candidate = sides
    attention = "attn_implementation"
    chosen = candidate.settings.get(attention)
    if reference.engine != candidate.engine or reference.patches or not candidate.patches or \
            attention in reference.launch or chosen is None or reference.settings.get(attention) == chosen:
        return
    reference.launch = {**reference.launch, attention: chosen}
    key = json.dumps([reference.engine.value, reference.launch, reference.patches], sort_keys=True)
    if key not in identities:
        identity = probe_identity(reference.engine, reference.launch, reference.patches)
        identities[key] = (dict(identity.engine_version),
                           {k: v for k, v in identity.settings.items() if k != "patches"})
    reference.engine_version, reference.settings = identities[key]


def _add_base(sides: list[_Side], base: Path) -> None:
    """A kernel contract's batch-invariant base (`invar.contract.kernel_base`): the whole base on the reference, the
    base's ops the kernel does not replace on the candidate (before its kernels), or one line saying why there is
    none (the reference stays the stock engine)."""
    from invar.contract.kernel_base import propose_base
    from invar.patches import patch_dir

    reference, candidate = sides
    attention = reference.launch.get("attn_implementation") or candidate.launch.get("attn_implementation")
    proposal = propose_base({key: patch_dir(key, base) for key in candidate.patches},
                            reference_engine=reference.engine.value, candidate_engine=candidate.engine.value,
                            dtypes={reference.dtype.value, candidate.dtype.value},
                            quantized=Quantization.NONE not in (reference.quantization, candidate.quantization),
                            attention=None if attention is None else str(attention))
    if proposal.absent is not None:
        typer.echo(f"{proposal.absent}; the reference is the stock engine (invariance relative to it also judges "
                   "the engine's own layout dependence)")
        return
    kernels = ", ".join(candidate.patches)
    reference.patches = _patches("the base", list(proposal.reference), reference.engine, base)
    candidate.patches = {**_patches("the base", list(proposal.candidate), candidate.engine, base),
                         **candidate.patches}
    typer.echo(f"batch-invariant base: the reference runs {', '.join(proposal.reference)}; the candidate runs "
               f"{', '.join((*proposal.candidate, kernels))}")


def _add_end_ids(sides: list[_Side]) -> None:
    """`--add-end-ids`: each model folder's chat template's turn end added to its `generation_config.json` where
    it is missing, said on one line per folder (the folder changes, so its digests are computed after)."""
    from invar.formats.tokenizer import ModelTokenizer
    from invar.tasks.special_tokens import add_end_ids

    for folder in dict.fromkeys(side.model for side in sides):
        tokenizer = ModelTokenizer.from_model_dir(folder)
        before = list(tokenizer.eos_token_ids)
        added = add_end_ids(tokenizer)
        if added is not None:
            typer.echo(f"{folder}: its chat template ends a turn with id {added[-1]}, which ended no response "
                       f"({tokenizer.eos_source} had {before}); wrote eos_token_id {list(added)} to "
                       f"{folder / 'generation_config.json'}")


def _describe(side: _Side) -> str:
    parts = [side.engine.value, side.dtype.value]
    if side.quantization != Quantization.NONE:
        parts.append(side.quantization.value)
    parts += [f"{k}={v}" for k, v in sorted(side.launch.items())] + sorted(side.patches)
    return " ".join(parts)
