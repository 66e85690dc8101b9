"""A declaration written as TOML from its model (`invar.contract.model.Declaration`): what `use init` writes.

A person reads a declaration before preparing it, so the file says what each line fixes: sections in reading order
(the use, the requirement, the layouts, then the packages), each key the model has set written once with a note. Only
the fields the declaration sets are written (pydantic's fields set), so a default stays a default; the requirement
states `confidence` (1 − δ), as owners write it. tomli_w writes no comments, and the values TOML needs here are few:
strings as JSON strings (TOML basic strings), numbers, booleans, arrays and inline tables with sorted keys, which is
also the one spelling `toml_document` gives any table of tables (test fixtures, benchmarks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from invar.errors import InvarError, one_line

if TYPE_CHECKING:  # `use`'s start imports this module for `toml_value`, and no model with it
    from invar.contract.model import Declaration

_COMMENT_COLUMN = 29
"""A note starts after this column; a longer `key = value` gets its note on the line above."""


def toml_value(value: Any, *, instead: str = "write the declaration by hand") -> str:
    """A value as TOML: strings as JSON strings (a TOML basic string), tables inline with sorted keys; `instead`
    says what to do with a value TOML cannot state."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v, instead=instead) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v, instead=instead)}"
                                for k, v in sorted(value.items())) + " }"
    raise InvarError(f"{value!r} cannot be written in TOML; {instead}")


def toml_document(data: Mapping[str, Any]) -> str:
    """A table of tables as a TOML document, without notes: top-level values first, then one table per dict (its
    values inline, `toml_value`), then one `[[key]]` per table of a list of tables."""
    head: list[str] = []
    body: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            body.append(f"\n[{key}]")
            body.extend(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                body.append(f"\n[[{key}]]")
                body.extend(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in item.items())
        else:
            head.append(f"{key} = {toml_value(value)}")
    return "\n".join(head + body) + "\n"


@dataclass(frozen=True)
class _Note:
    """What a key's line says: `after` beside it (or above it when the line is long), `before` on lines above."""

    after: str | None = None
    before: tuple[str, ...] = ()


def _line(key: str, value: Any, comment: str) -> str:
    text = f"{key} = {toml_value(value)}"
    return f"{text:<{_COMMENT_COLUMN}} # {comment}" if len(text) < _COMMENT_COLUMN else f"# {comment}\n{text}"


def _keys(values: Mapping[str, Any], notes: Mapping[str, _Note]) -> list[str]:
    """Each set key as its line with its note, in the order of `notes`, then any other key bare."""
    lines: list[str] = []
    for key in [*(k for k in notes if k in values), *(k for k in values if k not in notes)]:
        value, note = values[key], notes.get(key, _Note())
        lines += [f"# {text}" for text in note.before]
        lines.append(f"{key} = {toml_value(value)}" if note.after is None else _line(key, value, note.after))
    return lines


def _table(title: str, values: Mapping[str, Any], notes: Mapping[str, _Note], intro: Sequence[str] = ()) -> list[str]:
    return ["", f"[{title}]", *(f"# {text}" for text in intro), *_keys(values, notes)]


def _set(model: Any) -> dict[str, Any]:
    """The fields `model` sets, as JSON values (decimals as their canonical text), in the model's order."""
    dumped: dict[str, Any] = model.model_dump(mode="json", exclude_unset=True, by_alias=True)
    return {key: value for key, value in dumped.items() if value is not None}


_POPULATION = {"path": _Note(before=("The prompts the use is about: the file (relative to this file) and the sha256 of "
                                     "its bytes.",)),
               "sha256": _Note(),
               "unit": _Note("each unit gets one paired comparison"),
               "sample": _Note("a seeded sample of this many units (omit: every unit)")}
_SCORER = {"name": _Note("scores each response: its loss per unit (built in, or path.py:function)"), "version": _Note(),
           "sha256": _Note("the scorer file's sha256: a changed file is refused"),
           "settings": _Note("the scorer's settings")}
_SAMPLING = {"temperature": _Note("0 is greedy"), "top_p": _Note("nucleus mass kept before sampling"),
             "max_tokens": _Note("the longest response, end-of-sequence included")}
_REQUIREMENT = {"standard": _Note("population: a confidence bound; finite-domain: exact on the units"),
                "epsilon": _Note("ε: the largest allowed rise of the mean task loss"),
                "confidence": _Note("1 − δ: each side of the bound holds with this probability"),
                "method": _Note("the confidence bound that decides (docs/statistics.md)"),
                "sequential": _Note("look after each pairing call; stop when the bound decides"),
                "max_n": _Note("the most units the run uses: every unit the plan runs")}
_PAIRING = {"seed": _Note("fixes the sample, every unit's sampling seed and shuffled orders"),
            "layout": _Note("the batch layout both packages run for the paired comparison")}
_MEASUREMENTS = {"teacher_forcing": _Note("score the reference's responses on the reference's context"),
                 "capture_steps": _Note("response steps with a whole-vocabulary capture"),
                 "units": _Note("measure only the first batches covering this many units"),
                 "max_kl": _Note("a requirement: KL(reference ‖ candidate) in nats at every capture")}
_EXECUTION = {"requests_per_call": _Note("the most requests one worker call carries")}
_PREMISE = {"statement": _Note(), "party": _Note(),
            "basis_sha256": _Note("the document vouched with: here the population"),
            "reliance": _Note("the decision relies on the party's word")}


def _requirement(values: dict[str, Any]) -> dict[str, Any]:
    """The requirement with δ written as the confidence 1 − δ, in its place."""
    return {("confidence" if key == "delta" else key): (str(1 - Decimal(value)) if key == "delta" else value)
            for key, value in values.items()}


def _layout_notes(name: str, pairing: str, values: Mapping[str, Any]) -> dict[str, _Note]:
    size = ("every prompt alone" if values.get("batch_size") == 1 else
            "prompts per batch, in population order" if name == pairing else "larger batches")
    return {"batch_size": _Note(size), "order": _Note(f"in a seeded {values.get('order')} order")}


_DETERMINISM = {"required": _Note("any bit of difference between two runs violates the contract"),
                "layout": _Note("the layout run again: the pairing layout"),
                "runs": _Note("how many runs of it; each later one in a fresh worker"),
                "relative_to": _Note("the reference runs it again too; units it varies on are not counted")}


def _invariance_notes(values: Mapping[str, Any]) -> dict[str, _Note]:
    if not values.get("required"):
        return {"required": _Note("the candidate runs only the pairing layout")}
    if "relative_to" in values:
        return {"required": _Note("the candidate may add no layout dependence the reference lacks:"),
                "relative_to": _Note("the reference runs these layouts too", before=(
                    "a unit bit-identical under every layout below for the reference must be so for the candidate",)),
                "layouts": _Note()}
    return {"required": _Note("the candidate must give identical bits under every layout below")}


def _package(role: str, values: dict[str, Any], tokenizer_digest: str | None) -> list[str]:
    """A package's table: the identity its worker reports, then what it loads."""
    what = "that is trusted" if role == "reference" else "proposed to replace the reference"
    notes = {
        "engine": _Note("the engine whose worker runs the model"),
        "engine_version": _Note(before=("Every package version the worker reports (invar use package prints them).",)),
        "settings": _Note(before=("Every setting the worker's identity reports; launch options among them start the "
                                  "worker.",)),
        "worker_digest": _Note(before=("The digest of the worker's code (its module and the core modules it imports): "
                                       "other code is refused.",)),
        "patches": _Note(before=("Patches and kernels the worker runs with: a name under patches/, or a folder "
                                 "(relative to this file) → digest.",)),
        "model_dir": _Note(before=("The model folder (relative to this file) and its tree digest: another folder is "
                                   "refused.",)),
        "model_digest": _Note(),
        "dtype": _Note("the dtype the model is loaded in", before=() if tokenizer_digest is None else (
            f"(use prepare fixes its tokenizer digest, {tokenizer_digest}, in the contract)",)),
        "quantization": _Note("the weight quantization (none or nf4)"),
    }
    return _table(role, values, notes, (f"The package {what}: its worker must report exactly this identity at "
                                         "handshake.",))


def declaration_toml(declaration: Declaration, file_name: str,
                     tokenizer_digests: Mapping[str, str] | None = None) -> str:
    """`declaration` as the TOML file `file_name`, a note on each line: what `use init` writes. `tokenizer_digests`
    (by role) are noted under each package, as `use prepare` will fix them. Reading the text back
    (`invar.contract.model.parse_declaration`) gives `declaration`."""
    digests = tokenizer_digests or {}
    name = declaration.name
    contract = f"{one_line(name)}.contract.json"
    lines = [
        "# A use declaration written by `invar use init`: may the candidate package replace the reference for this",
        "# use? Every digest was computed from the files named here and every engine_version and settings is what",
        "# the worker reported. Paths are relative to this file. Next:",
        "#",
        f"#   invar use prepare {one_line(file_name)}            (writes {contract} beside it)",
        f"#   invar use run {contract} --run RUN",
        f"#   invar use admit RUN --contract {contract}",
        "",
        *_keys({key: value for key, value in _set(declaration).items() if key in ("name", "description")},
               {"name": _Note("the contract's name: use prepare writes <name>.contract.json"),
                "description": _Note("the use, in the owner's words")}),
    ]
    population = _set(declaration.population)
    lines += _table("population", population, _POPULATION)
    if "sample" not in population:
        lines.append("# no sample: every unit of the population is run")
    lines += _table("scorer", _set(declaration.scorer), _SCORER)
    lines += _table("sampling", _set(declaration.sampling), _SAMPLING,
                    ("Identical for both packages on every request.",))
    lines += _table("requirement", _requirement(_set(declaration.requirement)), _REQUIREMENT)
    lines += _table("pairing", _set(declaration.pairing), _PAIRING)
    for layout, model in declaration.layouts.items():
        values = _set(model)
        lines += _table(f"layouts.{layout}", values, _layout_notes(layout, declaration.pairing.layout, values))
    invariance = _set(declaration.invariance)
    lines += _table("invariance", invariance, _invariance_notes(invariance))
    if declaration.determinism is not None:
        lines += _table("determinism", _set(declaration.determinism), _DETERMINISM, (
            "The candidate runs this layout again in a worker started afresh and must reproduce every unit's tokens",
            "and log-probabilities bit for bit."))
    if declaration.measurements is not None:
        lines += _table("measurements", _set(declaration.measurements), _MEASUREMENTS, (
            "The candidate scores the reference's responses (teacher forcing) and both packages' whole-vocabulary",
            "distributions are captured at these steps."))
    lines += _table("execution", _set(declaration.execution), _EXECUTION)
    for role, package in (("reference", declaration.reference), ("candidate", declaration.candidate)):
        lines += _package(role, _set(package), digests.get(role))
    lines.append("")
    for premise in declaration.premises:
        lines += ["[[premises]]", "# An assumption the decision rests on, and who vouches for it.",
                  *_keys(_set(premise), _PREMISE), ""]
    if not declaration.premises:
        lines += ["# Premises the decision rests on (none stated; `use init --party NAME` writes one), e.g.",
                  "# [[premises]]",
                  '# statement = "The population represents the prompts the model will be asked in this use."',
                  '# party = "who vouches"', f"# basis_sha256 = {toml_value(declaration.population.sha256)}",
                  '# reliance = "vouched"', ""]
    return "\n".join(lines)
