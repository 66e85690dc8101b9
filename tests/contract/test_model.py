"""Declarations and contracts: validation messages name the field, and the canonical JSON names the contract."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path
from typing import Any

import pytest
from contract_runs import declaration, make_workspace

from invar.contract.model import Contract, parse_contract, parse_declaration, read_contract
from invar.errors import ContractError
from invar.tasks.arithmetic import load_population

ROOT = Path(__file__).resolve().parents[2]
POP = "a" * 64
MODEL = "b" * 64


def _error(**changes: Any) -> str:
    with pytest.raises(ContractError) as info:
        parse_declaration(declaration(POP, MODEL, **changes))
    return str(info.value)


def test_valid_declaration_converts_confidence_to_exact_delta() -> None:
    decl = parse_declaration(declaration(POP, MODEL))
    assert str(decl.requirement.delta) == "0.05"
    assert str(decl.requirement.epsilon) == "0.05"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"requirement": {"epsilon": 1.5}}, "declaration: requirement.epsilon: must be in (0, 1); got 1.5"),
        ({"requirement": {"epsilon": "abc"}}, "requirement.epsilon: must be a number"),
        ({"requirement": {"confidence": 1.0}}, "requirement.confidence: must be in (0, 1); got 1"),
        ({"requirement": {"method": None}}, "requirement.method: the population standard needs a bound method"),
        ({"requirement": {"standard": "finite-domain", "confidence": None, "method": None, "delta": None,
                          "epsilon": 0.1, "extra": 1}}, "requirement.extra: is not a known field"),
        ({"requirement": {"standard": "finite-domain", "confidence": None}},
         "requirement.method: the finite-domain standard uses no bound; remove it"),
        ({"requirement": {"standard": "finite-domain", "method": None}},
         "requirement.delta: the finite-domain standard makes no confidence claim; remove it"),
        ({"requirement": {"standard": "bayes"}}, "requirement.standard: input should be 'population' or"),
        ({"population": {"sha256": "ABC"}}, "population.sha256: must be a sha256 written as 64 lowercase hex"),
        ({"population": {"sample": 0}}, "population.sample: input should be greater than or equal to 1"),
        ({"pairing": {"layout": "nope"}}, "pairing.layout: 'nope' is not a key of layouts"),
        ({"invariance": {"layouts": ["solo"]}}, "invariance.layouts: invariance needs at least two distinct"),
        ({"invariance": {"required": False}}, "invariance.layouts: invariance is not required"),
        ({"layouts": {"solo": {"batch_size": 1}, "b4r": {"batch_size": 4}, "b8": {"batch_size": 8}}},
         "layouts.b8: is used by neither pairing nor invariance; remove it"),
        ({"layouts": {"solo": {"batch_size": 0}, "b4r": {"batch_size": 4}}},
         "layouts.solo.batch_size: input should be greater than or equal to 1"),
        ({"sampling": {"max_tokens": None}}, "sampling.max_tokens: is required; add it"),
        ({"candidate": {"quantization": "none", "engine_version": {"torch": "2.13.0+cpu",
                                                                    "transformers": "5.19.0"}, "patches": None}},
         "candidate: is identical to the reference package"),
        ({"premises": [{"statement": "s", "party": "p", "basis_sha256": "d" * 64, "reliance": "checked"}]},
         "premises[0]: a checked premise needs basis_path"),
    ],
)
def test_bad_declaration_names_field(changes: dict[str, Any], message: str) -> None:
    assert message in _error(**changes)


def test_error_is_one_line_and_counts_the_rest() -> None:
    text = _error(sampling={"max_tokens": None, "temperature": None})
    assert "\n" not in text
    assert text.endswith("(and 1 more problem)")


def test_canonical_json_round_trips_and_spelling_does_not_change_digest(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "a", units=20)
    raw = ws.contract_path.read_bytes()
    again = parse_contract(raw)
    assert again == ws.contract
    assert again.canonical_json() == raw
    contract, sha = read_contract(ws.contract_path)
    assert sha == ws.sha256 == contract.sha256()
    # 0.050 and 5E-2 are the same ε, so the same contract.
    other = make_workspace(tmp_path / "b", units=20, requirement={"epsilon": "5E-2"})
    assert other.contract_path.read_bytes() == raw


def test_edited_contract_is_another_contract_or_refused(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=20)
    edited = ws.contract_path.read_bytes().replace(b'"epsilon":"0.05"', b'"epsilon":"0.5"')
    ws.contract_path.write_bytes(edited)
    _, sha = read_contract(ws.contract_path)
    assert sha != ws.sha256  # another contract: a run made under the original is refused by it
    ws.contract_path.write_bytes(edited.replace(b'{"candidate"', b'{ "candidate"'))
    with pytest.raises(ContractError, match="not in canonical form"):
        read_contract(ws.contract_path)


def test_contract_of_other_schema_is_refused() -> None:
    with pytest.raises(ContractError, match=r"schema is 'invar\.contract/0'"):
        parse_contract(b'{"schema": "invar.contract/0"}')


def test_contract_model_forbids_unknown_fields(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=20)
    data = ws.contract.model_dump(mode="json", by_alias=True)
    data["requirement"]["slack"] = "0.1"
    with pytest.raises(Exception, match="slack"):
        Contract.model_validate(data)


@pytest.mark.parametrize("name", ["arith-nf4.toml", "arith-finite.toml"])
def test_example_declarations_are_valid(name: str) -> None:
    with (ROOT / "contracts" / name).open("rb") as f:
        decl = parse_declaration(tomllib.load(f), name)
    assert decl.requirement.standard == ("population" if "nf4" in name else "finite-domain")
    # The population the examples name is the shipped evaluation file, digest and all.
    problems = load_population(ROOT / "contracts" / decl.population.path, decl.population.sha256)
    assert decl.population.sample is not None
    assert decl.population.sample <= len(problems)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"description": "d" * 4097}, "description: is 4,097 characters long; the limit is 4,096: shorten it"),
        ({"premises": [{"statement": "s" * 1025, "party": "p", "basis_sha256": "d" * 64, "reliance": "vouched"}]},
         "premises[0].statement: is 1,025 characters long; the limit is 1,024: shorten it"),
        ({"premises": [{"statement": "s", "party": "p" * 257, "basis_sha256": "d" * 64, "reliance": "vouched"}]},
         "premises[0].party: is 257 characters long; the limit is 256: shorten it"),
        ({"premises": [{"statement": "s", "party": "p", "basis_sha256": "d" * 64, "reliance": "vouched"}] * 65},
         "premises: has 65 entries; the limit is 64: remove some"),
        ({"reference": {"engine_version": {f"pkg{i}": "1" for i in range(65)}}},
         "reference.engine_version: has 65 entries; the limit is 64: remove some"),
        ({"reference": {"engine_version": {"torch": "9" * 300}}},
         "reference.engine_version.torch: is 300 characters long; the limit is 256"),
        ({"reference": {"model_dir": "m" * 1025}}, "reference.model_dir: is 1,025 characters long; a path may have"),
        ({"reference": {"model_dir": "mod\x00el"}}, "reference.model_dir: must not contain a NUL character"),
        ({"population": {"path": ""}}, "population.path: must name a file or folder; got an empty path"),
        ({"layouts": {f"l{i}": {"batch_size": 1} for i in range(17)}},
         "layouts: has 17 entries; the limit is 16: remove some"),
        ({"requirement": {"method": "m" * 300}}, "requirement.method: is 300 characters long; the limit is 256"),
        ({"reference": {"settings": {"when": datetime.datetime(2024, 1, 1)}}},
         "reference.settings: holds datetime.datetime(2024, 1, 1, 0, 0), a datetime; settings are strings"),
        ({"reference": {"settings": {"x": [float("nan")]}}}, "reference.settings: holds nan; settings must be finite"),
        ({"reference": {"settings": {"x": 2**64}}}, "reference.settings: holds the integer 18446744073709551616"),
        ({"requirement": {"epsilon": "0.0100000000000000000000000000001"}},
         "requirement.epsilon: has more than 28 digits after the decimal point; round it"),
        ({"requirement": {"epsilon": "1E-999999999"}}, "requirement.epsilon: has more than 28 digits after"),
        ({"requirement": {"confidence": "0.95000000000000000000000000001"}},
         "requirement.confidence: has more than 28 digits after the decimal point"),
        ({"requirement": {"epsilon": "9" * 5000}}, "requirement.epsilon: must be in (0, 1); got 99999"),
    ],
)
def test_absurd_sizes_are_refused_naming_the_limit(changes: dict[str, Any], message: str) -> None:
    text = _error(**changes)
    assert message in text
    assert "\n" not in text
    assert len(text) < 400


def test_epsilon_with_28_places_is_kept_exactly() -> None:
    decl = parse_declaration(declaration(POP, MODEL, requirement={"epsilon": "0.0100000000000000000000000001"}))
    assert str(decl.requirement.epsilon) == "0.0100000000000000000000000001"


def test_hostile_keys_keep_the_message_to_one_short_line() -> None:
    text = _error(**{"a\nb" * 30000: 1})
    assert "\n" not in text
    assert len(text) < 300
    assert text.endswith("is not a known field; remove it or check its spelling")


def test_hostile_contract_bytes_are_one_line() -> None:
    for data, message in [
        (b'{"schema":"invar.contract/1","x":' + b"[" * 100 + b"]" * 100 + b"}", "nest more than 32 levels deep"),
        (b'{"schema":"invar.contract/1","seed":' + b"1" * 5000 + b"}", "a number has more than 4,300 digits"),
        (b'{"schema":"invar.contract/1","name":"\xff"}', r"not UTF-8 text \(byte 0xff at offset 37\)"),
        (b" " * (1 << 20) + b"{}", r"over the limit of 1 MiB \(1,048,576 bytes\) for a contract"),
        (b'{"schema":"' + b"s" * 100000 + b'"}', r"schema is 'sssss.*…, this Invar reads"),
    ]:
        with pytest.raises(ContractError, match=message) as info:
            parse_contract(data)
        assert len(str(info.value)) < 300
