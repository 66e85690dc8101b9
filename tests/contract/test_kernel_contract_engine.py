"""The kernel contract `use init --candidate-patch --invariance` proposes, decided end to end on the real Hugging Face
worker and the shipped tiny model: the reference runs the batch-invariant base (stock HF alone varies across the
layouts on some units), so the batch-variant `split-k` patch is Violated for the layout dependence it adds, while its
teacher-forced captures stay within `max_kl` (it is a correct float32 product); a padding-invariant softmax kernel on
the base is Admitted."""

from __future__ import annotations

import json
import os
import shutil
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
                  "--epsilon", "0.5", "--invariance", "--no-determinism", cwd=tmp_path)
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
    assert inv["reference_units_differing"] == 0  # the base makes the reference batch invariant: every unit covered
    assert 0 < len(inv["gained_units"]) == inv["units_differing"] <= inv["candidate_units_differing"]
    # A correct float32 product: its captures are within the proposed max_kl.
    assert decision["measurements"]["requirement"]["holds"] is True


def test_a_padding_invariant_softmax_kernel_on_the_base_is_admitted(tmp_path: Path) -> None:
    # fixed-block's softmax as an agent's kernel folder: the candidate runs the base less its softmax, plus the kernel;
    # both sides run eager attention (where the model's softmax is), so the packages differ in the kernel alone.
    shutil.copytree(REPO_ROOT / "patches" / "invariant-softmax", tmp_path / "my-softmax")
    made = _invar("use", "init", "k.toml", "--candidate-patch", "./my-softmax", "--sample", "16", "--temperature",
                  "0", "--epsilon", "0.5", "--invariance", "--no-determinism", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    decl = tomllib.loads((tmp_path / "k.toml").read_text(encoding="utf-8"))
    assert decl["candidate"]["settings"]["attn_implementation"] == "eager"
    assert decl["reference"]["settings"]["attn_implementation"] == "eager"
    assert "invariant-softmax" in decl["reference"]["patches"]
    assert sorted(decl["candidate"]["patches"]) == ["./my-softmax", "invariant-log-softmax", "invariant-matmul",
                                                    "invariant-rms-norm"]
    assert _invar("use", "prepare", "k.toml", cwd=tmp_path).returncode == 0
    ran = _invar("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    admitted = _invar("use", "admit", "run", "--contract", "k.contract.json", "--json", cwd=tmp_path)
    decision = json.loads(admitted.stdout)
    assert admitted.returncode == 0, (decision["reason"], admitted.stderr)
    assert decision["answer"] == "Admitted"
    assert decision["invariance"]["reference_units_differing"] == 0
    assert decision["invariance"]["candidate_units_differing"] == 0
