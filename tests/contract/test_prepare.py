"""`prepare`: every anchor a declaration names is checked against the files before the contract is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from contract_runs import declaration, make_model, make_workspace, toml_text

from invar import canonical
from invar.contract.prepare import load_contract, prepare
from invar.errors import ContractError
from invar.tasks.arithmetic import population, population_bytes


def test_prepare_writes_contract_and_sha256sum_file(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    digest_file = tmp_path / "arith-test.contract.json.sha256"
    assert digest_file.read_text() == f"{ws.sha256}  arith-test.contract.json\n"
    assert canonical.sha256(ws.contract_path.read_bytes()) == ws.sha256
    assert ws.contract.population.size == 30
    assert ws.contract.method_version is not None
    assert ws.contract.reference.model_dir == "model"
    contract, sha, plan = load_contract(ws.contract_path)
    assert (contract, sha, plan) == (ws.contract, ws.sha256, ws.plan)


def test_prepare_is_deterministic_and_never_overwrites_a_different_contract(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    again = prepare(tmp_path / "decl.toml")
    assert again.sha256 == ws.sha256
    text = (tmp_path / "decl.toml").read_text().replace('"seed" = 20240601', '"seed" = 5')
    (tmp_path / "decl.toml").write_text(text)
    with pytest.raises(ContractError, match="a different contract of this name already exists"):
        prepare(tmp_path / "decl.toml")


def test_paths_are_relative_to_the_contract_folder(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "owner", units=30)
    out = prepare(tmp_path / "owner" / "decl.toml", tmp_path / "elsewhere" / "contracts")
    assert out.contract.population.path == "../../owner/population.jsonl"
    assert out.contract.reference.model_dir == "../../owner/model"
    assert out.sha256 != ws.sha256  # the paths are part of the contract's bytes
    assert load_contract(out.path)[2].units == ws.plan.units


def _prepare_with(tmp_path: Path, **changes: Any) -> str:
    model_digest = make_model(tmp_path / "model")
    data = population_bytes(population("eval", seed=11, count=30, id_prefix="u"))
    (tmp_path / "population.jsonl").write_bytes(data)
    decl = declaration(canonical.sha256(data), model_digest, **changes)
    (tmp_path / "decl.toml").write_text(toml_text(decl))
    with pytest.raises(ContractError) as info:
        prepare(tmp_path / "decl.toml")
    return str(info.value)


def test_wrong_population_digest_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, population={"sha256": "e" * 64})
    assert msg.startswith("population: population file")
    assert "was declared" in msg


def test_sample_larger_than_population_is_refused(tmp_path: Path) -> None:
    assert "population.sample: 31 exceeds the 30 units" in _prepare_with(tmp_path, population={"sample": 31})


def test_wrong_model_digest_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, candidate={"model_digest": "e" * 64})
    assert msg.startswith("candidate.model_digest: folder")


def test_missing_adapter_folder_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, candidate={"adapter": {"path": "lora", "digest": "e" * 64}})
    assert msg.startswith("candidate.adapter.digest: folder")
    assert "does not exist" in msg


def test_unknown_scorer_and_settings_are_refused(tmp_path: Path) -> None:
    assert "scorer.name: unknown scorer 'bleu'" in _prepare_with(tmp_path / "a", scorer={"name": "bleu"})
    msg = _prepare_with(tmp_path / "b", scorer={"settings": {"strict": True}})
    assert "scorer.settings: scorer 'arithmetic-exact' takes no settings" in msg


def test_unknown_bound_method_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, requirement={"method": "magic"})
    assert "requirement.method: unknown bound method 'magic'; use one of hoeffding, maurer-pontil" in msg


def test_checked_premise_must_match_its_file(tmp_path: Path) -> None:
    (tmp_path / "basis.txt").write_text("the owner's memo\n")
    premise = {"statement": "s", "party": "p", "basis_sha256": "e" * 64, "reliance": "checked",
               "basis_path": "basis.txt"}
    msg = _prepare_with(tmp_path, premises=[premise])
    assert msg.startswith("premises[0].basis_sha256:")


def test_tokenizer_that_the_core_cannot_read_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_model(model)
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["model"]["type"] = "BPE"
    (model / "tokenizer.json").write_text(json.dumps(tok))
    digest = canonical.tree_digest(model)
    data = population_bytes(population("eval", seed=11, count=30, id_prefix="u"))
    (tmp_path / "population.jsonl").write_bytes(data)
    decl = declaration(canonical.sha256(data), digest)
    (tmp_path / "decl.toml").write_text(toml_text(decl))
    with pytest.raises(ContractError, match=r"reference\.model_dir: .*expected a WordLevel model"):
        prepare(tmp_path / "decl.toml")


def test_bad_toml_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "decl.toml").write_text("name = \n")
    with pytest.raises(ContractError, match="not valid TOML"):
        prepare(tmp_path / "decl.toml")
    with pytest.raises(ContractError, match="cannot read the declaration"):
        prepare(tmp_path / "missing.toml")


def test_moved_population_is_refused_at_load(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=30)
    shutil.move(tmp_path / "w" / "population.jsonl", tmp_path / "population.jsonl")
    with pytest.raises(ContractError, match=r"population: population file .* does not exist"):
        load_contract(ws.contract_path)
