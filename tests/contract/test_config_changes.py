"""The two packages' effective configurations in the contract: `use prepare` compares the reference's model folder
with the candidate's (config.json read the transformers way) and refuses a difference the declaration does not name
as the contract's purpose (`config_changes`); a declared one is recorded with both values. A package's
`known_premises` turn a field its engine does not honour into a recorded premise instead of a refusal at `use run`.
Contracts that declare neither keep their bytes. The workers here are the in-process fakes (tests/support), which
report the effective configuration the test scripts: every claim is about the core's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from contract_runs import declaration, make_model, toml_text
from support.fake_worker import ENGINE_VERSION, FakeTransport, FakeWorker, Script

from invar import canonical
from invar.contract.model import Contract
from invar.contract.prepare import load_contract, prepare
from invar.errors import ContractError
from invar.formats.model_config import FIELDS, ConfigMismatch, comparison, folder_config, read_config
from invar.records import RunStore
from invar.runner.use_run import use_run
from invar.tasks.arithmetic import population, population_bytes

DECODER = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "rope_theta": 10_000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": False}
"""A small Llama's config.json (the character tokenizer gives the vocabulary size)."""


def _model(folder: Path, **config: Any) -> str:
    make_model(folder)
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**written, **DECODER, **config}))
    return canonical.tree_digest(folder)


def _declaration(root: Path, candidate_config: dict[str, Any] | None = None, **changes: Any) -> Path:
    """A declaration over fake workers (the reference plain, the candidate nf4); the candidate's model is a second
    folder with `candidate_config` over the reference's config.json when given."""
    root.mkdir(parents=True, exist_ok=True)
    reference_digest = _model(root / "model")
    candidate: dict[str, Any] = {"engine_version": ENGINE_VERSION, "patches": None, **changes.pop("candidate", {})}
    if candidate_config is not None:
        candidate |= {"model_dir": "model-b", "model_digest": _model(root / "model-b", **candidate_config)}
    data = population_bytes(population("eval", seed=11, count=8, id_prefix="u"))
    (root / "population.jsonl").write_bytes(data)
    decl = declaration(canonical.sha256(data), reference_digest, reference={"engine_version": ENGINE_VERSION},
                       candidate=candidate, execution={"requests_per_call": 8}, **changes)
    (root / "decl.toml").write_text(toml_text(decl), encoding="utf-8")
    return root / "decl.toml"


def test_a_candidate_model_of_another_configuration_is_refused_unless_that_is_the_contracts_purpose(
        tmp_path: Path) -> None:
    path = _declaration(tmp_path, {"rope_theta": 500_000.0})
    with pytest.raises(ContractError) as info:
        prepare(path)
    assert str(info.value) == (
        "candidate.model_dir: the candidate's config.json gives rope_theta = [500000, 500000], the reference's "
        "[10000, 10000]: the two packages compute different models; point both at the same configuration, or "
        "declare the change as the contract's purpose (config_changes = [\"rope_theta\"])")


def test_a_declared_configuration_change_is_recorded_with_both_values(tmp_path: Path) -> None:
    prepared = prepare(_declaration(tmp_path, {"rope_theta": 500_000.0}, config_changes=["rope_theta"]))
    change = prepared.contract.config_changes["rope_theta"]
    assert (change.reference, change.candidate) == ([10_000.0, 10_000.0], [500_000.0, 500_000.0])
    assert list(prepared.contract.config_changes) == ["rope_theta"]  # nothing else differs
    recorded = json.loads(prepared.path.read_bytes())["config_changes"]
    assert recorded == {"rope_theta": {"reference": [10_000.0, 10_000.0], "candidate": [500_000.0, 500_000.0]}}
    assert load_contract(prepared.path)[0] == prepared.contract


def test_a_declared_change_the_folders_do_not_make_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError) as info:
        prepare(_declaration(tmp_path, {"rope_theta": 500_000.0}, config_changes=["rope_theta", "norm_eps"]))
    assert str(info.value) == ("config_changes: the candidate's model computes norm_eps as the reference's (1e-05), "
                               "so the contract changes nothing there; remove it")
    with pytest.raises(ContractError, match=r"^config_changes: the two model folders give the same configuration"):
        prepare(_declaration(tmp_path / "same", config_changes=["rope_theta"]))


def test_a_contract_without_changes_or_premises_keeps_its_bytes(tmp_path: Path) -> None:
    prepared = prepare(_declaration(tmp_path, {"hidden_size": 64}))  # another folder, the same configuration
    data = json.loads(prepared.path.read_bytes())
    assert "config_changes" not in data
    assert "known_premises" not in data["reference"]
    assert "known_premises" not in data["candidate"]


def test_known_premises_name_fields_of_the_effective_configuration(tmp_path: Path) -> None:
    path = _declaration(tmp_path, candidate={"known_premises": [{"field": "embed_scal", "why": "mlx-lm rounds"}]})
    with pytest.raises(ContractError) as info:
        prepare(path)
    assert "candidate.known_premises" in str(info.value)
    assert "'embed_scal' is not a field of the effective configuration" in str(info.value)
    premise = {"field": "embed_scale", "why": "mlx-lm rounds √hidden to bfloat16"}
    path = _declaration(tmp_path / "twice", candidate={"known_premises": [premise, premise]})
    with pytest.raises(ContractError, match="field 'embed_scale' is declared a known premise twice"):
        prepare(path)


def _reporting_embed_scale(worker: FakeWorker, model: Path) -> dict[str, Any]:
    """The folder's configuration, but the candidate scales the embedding by 25.25 (as mlx-lm does Gemma 3's)."""
    effective = folder_config(read_config(model))
    return {**effective, "embed_scale": 25.25} if worker.package == "candidate" else effective


def test_use_run_refuses_a_worker_computing_another_configuration_unless_its_package_declares_the_premise(
        tmp_path: Path) -> None:
    transport = FakeTransport(Script(effective_config=_reporting_embed_scale))
    refused = prepare(_declaration(tmp_path / "refused"))
    with pytest.raises(ConfigMismatch) as info:
        use_run(refused.path, tmp_path / "refused-run", transport=transport)
    assert str(info.value).startswith("the hf engine does not compute the model in ")
    assert str(info.value).endswith(
        ": embed_scale: the folder's config.json gives null, the engine computes with 25.25; run it on an engine "
        "that honours the field, or declare it a known premise in the package's table (known_premises = "
        "[{field = \"embed_scale\", why = \"...\"}])")
    assert [method for _, method in transport.received if method not in ("load_model",)] == []  # no call made

    premise = {"field": "embed_scale", "why": "the candidate engine scales the embedding by √hidden"}
    accepted = prepare(_declaration(tmp_path / "accepted", candidate={"known_premises": [premise]}))
    assert json.loads(accepted.path.read_bytes())["candidate"]["known_premises"] == [premise]
    run = tmp_path / "accepted-run"
    outcome = use_run(accepted.path, run, transport=FakeTransport(Script(effective_config=_reporting_embed_scale)))
    assert outcome.calls_issued == outcome.calls_total > 0
    with RunStore.open(run) as store:  # the records keep what each worker reported it computes with
        loads = [c.report.report.result for c in store.calls()
                 if c.call.method == "load_model" and c.report is not None and c.report.report.result is not None]
    assert sorted(r["effective_config"]["embed_scale"] or 0.0 for r in loads) == [0.0, 25.25]


def test_the_comparison_says_equal_premise_refused_or_not_reported_for_each_field() -> None:
    folder = folder_config({**DECODER, "model_type": "gemma2", "vocab_size": 32, "attn_logit_softcapping": 50.0})
    assert folder["attn_softcap_tanh"] == "tanh"  # transformers' softcap · tanh(x / softcap)
    engine = {k: v for k, v in folder.items() if k != "norm_eps"}
    engine |= {"attn_softcap_tanh": "fast_exp", "embed_scale": 9.0}
    rows = {name: (want, got, verdict) for name, want, got, verdict in comparison(folder, engine, ("embed_scale",))}
    assert list(rows) == list(FIELDS)
    assert rows["attn_softcap_tanh"] == ("tanh", "fast_exp", "refused")
    assert rows["embed_scale"] == (8.0, 9.0, "premise")  # √64
    assert rows["norm_eps"] == (1e-5, None, "not reported")
    assert {verdict for _, _, verdict in rows.values()} == {"equal", "premise", "refused", "not reported"}


def test_use_run_refuses_a_recorded_change_the_folders_do_not_give(tmp_path: Path) -> None:
    """A contract whose recorded configuration change is not what this Invar reads from the two folders (written by
    an Invar that read config.json otherwise) is refused before any worker starts."""
    prepared = prepare(_declaration(tmp_path, {"rope_theta": 500_000.0}, config_changes=["rope_theta"]))
    data = json.loads(prepared.path.read_bytes())
    data["config_changes"]["rope_theta"]["candidate"] = [400_000.0, 400_000.0]
    other = Contract.model_validate(data)
    path = tmp_path / "other.contract.json"
    path.write_bytes(other.canonical_json())
    path.with_name(path.name + ".sha256").write_text(f"{other.sha256()}  {path.name}\n")
    transport = FakeTransport()
    with pytest.raises(ContractError) as info:
        use_run(path, tmp_path / "run", transport=transport)
    assert str(info.value) == (
        "config_changes.rope_theta: the contract records [400000, 400000] for the candidate, this Invar reads "
        f"[500000, 500000] from {tmp_path / 'model-b' / 'config.json'}; prepare the contract again from its "
        "declaration")
    assert transport.received == []  # no worker started
