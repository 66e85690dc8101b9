"""Sequential admission end to end on the real Hugging Face engine: `use run` stops at the first look where the
anytime-valid bound decides, a run killed mid-look resumes to the same stop, and `use admit` recomputes it (with a
receipt that verifies). A candidate whose tokens equal the reference's (patches/fixed-block) stops Admitted before
n_max; one with a destructive LoRA adapter stops Violated at the first look."""

from __future__ import annotations

import shutil
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

import pytest

from invar import canonical
from invar.contract.admit import admit
from invar.contract.bind import SEQUENTIAL_META
from invar.contract.decide import Answer
from invar.contract.model import parse_declaration
from invar.contract.prepare import build_contract, load_contract
from invar.contract.receipt import make_receipt, verify_receipt, write_receipt
from invar.engines import DEFAULT_MODEL
from invar.records import RunStore
from invar.runner.use_run import use_run

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

pytestmark = pytest.mark.engine

CONTRACTS = REPO_ROOT / "contracts"
UNITS = 48
PER_LOOK = 16  # three looks of 16 units


def _declaration(name: str, epsilon: str, candidate: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fixed-block acceptance declaration made sequential and small: pairing batches of 16, one call (one look)
    per batch, no invariance layouts (a sequential run does not cover every unit under them)."""
    data = tomllib.loads((CONTRACTS / "arith-fixed-block.toml").read_text(encoding="utf-8"))
    data["name"] = name
    data["population"]["sample"] = UNITS
    data["requirement"] = {"standard": "population", "epsilon": epsilon, "confidence": "0.95",
                           "method": "paired-binary-sequence", "sequential": True, "max_n": UNITS}
    data["layouts"] = {"b16": {"batch_size": 16}}
    data["invariance"] = {"required": False}
    data["execution"] = {"requests_per_call": PER_LOOK}
    data["premises"] = []
    if candidate is not None:
        data["candidate"] = candidate
    return data


def _prepare(data: dict[str, Any], out: Path) -> Path:
    contract, _units = build_contract(parse_declaration(data, data["name"]), CONTRACTS, out)
    path = out / f"{contract.name}.contract.json"
    path.write_bytes(contract.canonical_json())
    return path


def _build_adapter(out: Path) -> None:
    """A LoRA adapter on every attention and MLP projection with entries N(0, 1): it wrecks the model's answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    model.save_pretrained(out)


def _cut_after_first_report_of(run: Path, look: int, contract: Path) -> int:
    """Simulate a kill during look `look` (0-based): drop every record after the first report of that look's calls,
    as a process killed there leaves its store (the chain prefix stays valid; there is no closing record)."""
    _c, _sha, plan = load_contract(contract)
    digests = {c.params_digest for c in plan.look_calls(look)}
    with RunStore.open(run) as store:
        answered = [r.report.seq for r in store.calls()
                    if r.call.method == "generate" and canonical.digest(r.call.params) in digests
                    and r.report is not None]
    keep = min(answered)
    conn = sqlite3.connect(run / "records.sqlite")
    conn.execute("DROP TRIGGER log_no_delete")
    conn.execute("DELETE FROM log WHERE seq > ?", (keep,))
    conn.commit()
    conn.close()
    return keep


def test_an_identical_candidate_stops_admitted_before_n_max_and_a_killed_run_resumes_to_the_same_stop(
        tmp_path: Path) -> None:
    # fixed-block gives the reference's tokens on this task, so every d is 0: the upper bound after 16 units (0.295)
    # is above ε = 0.2 and after 32 units (0.164) below it, so the rule stops at look 2 of 3.
    contract = _prepare(_declaration("seq-fixed-block", "0.2"), tmp_path)
    run = tmp_path / "run"
    outcome = use_run(contract, run)
    assert outcome.stop is not None
    assert (outcome.stop["answer"], outcome.stop["look"], outcome.stop["units"]) == ("Admitted", 2, 32)
    assert outcome.calls_issued == 4  # two looks of one call per package; look 3 never ran
    decision = admit(contract, run, expect_head=outcome.head)
    assert decision.answer is Answer.ADMITTED
    assert decision.sequential is not None
    assert len(decision.sequential.looks) == 2
    assert decision.task_loss.n == 32
    assert decision.task_loss.worse == decision.task_loss.better == 0
    assert "paired-binary-sequence/1" in decision.reason
    assert "stopped at look 2 with 32 of n_max = 48" in \
        decision.reason
    assert decision.bound is not None
    assert decision.bound.upper <= 0.2 < 0.295
    assert decision.sequential is not None
    assert decision.sequential.output().version == "paired-binary-sequence/1"
    receipt = tmp_path / "receipt.json"
    write_receipt(receipt, make_receipt(decision, contract=contract))
    assert verify_receipt(receipt, run, contract, trust_embedded_key=True).decision.answer is Answer.ADMITTED

    # Killed after the first answer of look 2: the resumed run issues only what look 2 lacks and stops there too.
    killed = tmp_path / "killed"
    shutil.copytree(run, killed)
    _cut_after_first_report_of(killed, 1, contract)
    with RunStore.open(killed) as store:
        assert not store.closed
        assert SEQUENTIAL_META not in store.meta()
    resumed = use_run(contract, killed)
    assert resumed.calls_issued == 1
    assert resumed.stop == {**outcome.stop, "calls": resumed.stop["calls"]}
    again = admit(contract, killed, expect_head=resumed.head)
    assert (again.answer, again.reason, again.task_loss) == (decision.answer, decision.reason, decision.task_loss)


def test_a_broken_candidate_stops_violated_at_the_first_look(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    _build_adapter(adapter)
    data = _declaration("seq-broken", "0.2")
    candidate = {**data["reference"], "adapter": {"path": str(adapter), "digest": canonical.tree_digest(adapter)}}
    contract = _prepare(_declaration("seq-broken", "0.2", candidate), tmp_path)
    run = tmp_path / "run"
    outcome = use_run(contract, run)
    assert outcome.stop is not None
    assert (outcome.stop["answer"], outcome.stop["look"], outcome.stop["units"]) == ("Violated", 1, 16)
    decision = admit(contract, run, expect_head=outcome.head)
    assert decision.answer is Answer.VIOLATED
    assert decision.task_loss.n == 16
    assert decision.task_loss.worse >= 8
    assert decision.bound is not None
    assert decision.bound.lower > 0.2
