"""The kernel contract `use init --candidate-patch` proposes, decided end to end on the real Hugging Face worker and
the shipped tiny model: stock HF varies across the layouts on some units by itself, and the batch-variant `split-k`
patch is Violated for the layout dependence it adds on units where the stock engine is invariant, while its
teacher-forced captures stay within `max_kl` (it is a correct float32 product)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.engine


def _invar(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env=env)


def test_split_k_is_violated_for_the_dependence_it_adds(tmp_path: Path) -> None:
    made = _invar("use", "init", "k.toml", "--candidate-patch", "split-k", "--sample", "24", "--temperature", "0",
                  "--epsilon", "0.5", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert _invar("use", "prepare", "k.toml", cwd=tmp_path).returncode == 0
    ran = _invar("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    admitted = _invar("use", "admit", "run", "--contract", "k.contract.json", "--json", cwd=tmp_path)
    decision = json.loads(admitted.stdout)
    assert admitted.returncode == 10, admitted.stderr
    assert decision["answer"] == "Violated"
    assert decision["reason"].startswith("invariance relative to the reference: ")
    inv = decision["invariance"]
    assert inv["relative_to"] == "reference"
    assert inv["reference_units_differing"] > 0  # the stock engine is not batch invariant here
    assert 0 < len(inv["gained_units"]) == inv["units_differing"] <= inv["candidate_units_differing"]
    # A correct float32 product: its captures are within the proposed max_kl.
    assert decision["measurements"]["requirement"]["holds"] is True


def test_a_softmax_function_kernel_gives_the_reference_eager_attention(tmp_path: Path) -> None:
    # A softmax kernel is on the model's path through eager attention only: its worker reports eager, and the stock
    # reference `use init` proposes runs eager too, so the two packages differ in the kernel alone.
    kernel = REPO_ROOT / "examples" / "kernels" / "softmax-fp32"
    made = _invar("use", "init", "k.toml", "--candidate-patch", str(kernel), "--sample", "24", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    decl = tomllib.loads((tmp_path / "k.toml").read_text(encoding="utf-8"))
    assert decl["candidate"]["settings"]["attn_implementation"] == "eager"
    assert decl["reference"]["settings"]["attn_implementation"] == "eager"
    assert "patches" not in decl["reference"]
