"""The contract `use init --candidate-patch` proposes for a kernel (the task bound, `max_kl`, determinism relative to
the stock reference; no batch invariance), decided end to end on the real Hugging Face worker and the shipped tiny
model: a correct elementwise kernel is Admitted, and stock HF reproduces every unit when the pairing layout is run
again in a fresh worker; `examples/kernels/matmul-random-split`, whose reduction order is drawn afresh on every call,
is Violated by determinism, which names the units."""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_batch import InvarSession

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py), their workers started as a user's command starts them: the CLI's start-up once."""
    with InvarSession(bound_s=900) as session:
        yield session


def _decide(cli: InvarSession, tmp_path: Path, kernel: str, units: int, *extra: str) -> tuple[int, dict[str, Any]]:
    shutil.copytree(REPO_ROOT / "examples" / "kernels" / kernel, tmp_path / kernel)
    made = cli.run("use", "init", "k.toml", "--candidate-patch", f"./{kernel}", "--sample", str(units),
                   "--temperature", "0", "--epsilon", "0.5", *extra, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    decl = tomllib.loads((tmp_path / "k.toml").read_text(encoding="utf-8"))
    assert decl["determinism"] == {"required": True, "layout": "b16", "runs": 2, "relative_to": "reference"}
    assert decl["invariance"] == {"required": False}
    assert cli.run("use", "prepare", "k.toml", cwd=tmp_path).returncode == 0
    ran = cli.run("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    admitted = cli.run("use", "admit", "run", "--contract", "k.contract.json", "--json", cwd=tmp_path)
    assert admitted.returncode in (0, 10, 11), admitted.stderr
    return admitted.returncode, json.loads(admitted.stdout)


def test_a_correct_kernel_is_admitted_and_stock_hf_reproduces_every_unit(cli: InvarSession, tmp_path: Path) -> None:
    code, decision = _decide(cli, tmp_path, "silu-fp32", 16)
    assert code == 0, decision["reason"]
    det = decision["determinism"]
    assert (det["holds"], det["units"], det["candidate_units_differing"], det["reference_units_differing"]) == \
        (True, 16, 0, 0)
    # The later runs are on record as calls of their own (admission refuses one answered by the first run's worker).
    calls = {e["call"] for e in decision["evidence"]}
    assert {"candidate/b16@2#0", "reference/b16@2#0"} <= calls


def test_a_reduction_order_drawn_on_every_call_is_violated_by_determinism(cli: InvarSession, tmp_path: Path) -> None:
    # No measurements: the claim is about determinism alone (its split changes bits, not answers).
    code, decision = _decide(cli, tmp_path, "matmul-random-split", 32, "--no-measurements")
    assert code == 10
    reason = decision["reason"]
    assert reason.startswith("determinism: "), reason
    assert "differ between 2 runs of layout b16 under the candidate (0 differ between the reference's runs" in reason
    det = decision["determinism"]
    assert det["reference_units_differing"] == 0
    assert 0 < det["units_differing"] == len(det["differing_units"]) == det["candidate_units_differing"]
