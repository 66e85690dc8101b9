"""The acceptance contracts of docs/acceptance.md at reduced size, run with `use run` and decided with `use admit`
on the real engines: split-k is caught by invariance, fixed-block is bit-identical across the layouts on Hugging
Face (FP32 and NF4), vLLM is too, and the finite-domain contract is decided exactly."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from invar.contract.admit import admit
from invar.contract.decide import Answer
from invar.contract.model import parse_declaration
from invar.contract.prepare import build_contract
from invar.runner.use_run import use_run

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CONTRACTS = REPO_ROOT / "contracts"
UNITS = 32
"""The fewest units that fill one batch of the largest layout (b32-shuffled): the three layouts then run batches of
16, 32 and 1 rows, the row counts split-k's reduction order follows."""


def _small(name: str, out: Path, units: int = UNITS) -> Path:
    """The shipped declaration `name` with its sample cut to `units`, prepared into `out`."""
    data = tomllib.loads((CONTRACTS / f"{name}.toml").read_text(encoding="utf-8"))
    data["name"] = f"{name}-small"
    data["population"]["sample"] = units
    contract, _units = build_contract(parse_declaration(data, name), CONTRACTS, out)
    path = out / f"{contract.name}.contract.json"
    path.write_bytes(contract.canonical_json())
    return path


def test_split_k_is_violated_by_invariance(tmp_path: Path) -> None:
    contract = _small("arith-split-k", tmp_path)
    use_run(contract, tmp_path / "run")
    d = admit(contract, tmp_path / "run")
    assert d.answer is Answer.VIOLATED
    assert not d.invariance.holds
    assert d.reason.startswith("invariance: ")
    assert "log-probabilities differ at position" in d.reason or "tokens differ" in d.reason
    assert "(bits " in (d.invariance.first_difference or "") or "tokens differ" in (d.invariance.first_difference or "")


@pytest.mark.parametrize("name", ["arith-fixed-block", "arith-nf4-fixed-block", "arith-vllm"])
def test_batch_invariant_candidates_hold_invariance(tmp_path: Path, name: str) -> None:
    contract = _small(name, tmp_path)
    use_run(contract, tmp_path / "run")
    d = admit(contract, tmp_path / "run")
    assert d.invariance.holds, d.invariance.first_difference
    assert d.invariance.layouts == ("b16", "b32-shuffled", "solo")
    assert d.task_loss.n == UNITS
    # 32 prompts cannot establish a 1-in-100 allowance: the bound leaves the question open, or the loss is too high.
    assert d.answer in (Answer.UNKNOWN, Answer.VIOLATED)


def test_finite_domain_is_decided_exactly(tmp_path: Path) -> None:
    contract = _small("arith-finite", tmp_path, units=16)
    use_run(contract, tmp_path / "run")
    d = admit(contract, tmp_path / "run")
    assert d.bound is None
    assert d.answer in (Answer.ADMITTED, Answer.VIOLATED)
    assert "finite domain: mean loss increase over exactly the 16 declared units" in d.reason
