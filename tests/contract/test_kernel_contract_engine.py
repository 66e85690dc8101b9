"""The kernel contract `use init --candidate-patch --invariance` proposes, decided end to end on the real Hugging Face
worker and the shipped tiny model: the reference runs the batch-invariant base (stock HF alone varies across the
layouts on some units), so the batch-variant `split-k` patch is Violated for the layout dependence it adds, while its
teacher-forced captures stay within `max_kl` (it is a correct float32 product); a padding-invariant softmax kernel on
the base is Admitted."""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path

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


def test_split_k_is_violated_for_the_dependence_it_adds(cli: InvarSession, tmp_path: Path) -> None:
    made = cli.run("use", "init", "k.toml", "--candidate-patch", "split-k", "--sample", "24", "--temperature", "0",
                   "--epsilon", "0.5", "--invariance", "--no-determinism", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert cli.run("use", "prepare", "k.toml", cwd=tmp_path).returncode == 0
    ran = cli.run("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    admitted = cli.run("use", "admit", "run", "--contract", "k.contract.json", "--json", cwd=tmp_path)
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


def test_a_padding_invariant_softmax_kernel_on_the_base_is_admitted(cli: InvarSession, tmp_path: Path) -> None:
    # fixed-block's softmax as an agent's kernel folder: the candidate runs the base less its softmax, plus the kernel;
    # both sides run eager attention (where the model's softmax is), so the packages differ in the kernel alone.
    shutil.copytree(REPO_ROOT / "patches" / "invariant-softmax", tmp_path / "my-softmax")
    made = cli.run("use", "init", "k.toml", "--candidate-patch", "./my-softmax", "--sample", "16", "--temperature",
                   "0", "--epsilon", "0.5", "--invariance", "--no-determinism", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    decl = tomllib.loads((tmp_path / "k.toml").read_text(encoding="utf-8"))
    assert decl["candidate"]["settings"]["attn_implementation"] == "eager"
    assert decl["reference"]["settings"]["attn_implementation"] == "eager"
    assert "invariant-softmax" in decl["reference"]["patches"]
    assert sorted(decl["candidate"]["patches"]) == ["./my-softmax", "invariant-log-softmax", "invariant-matmul",
                                                    "invariant-rms-norm"]
    assert cli.run("use", "prepare", "k.toml", cwd=tmp_path).returncode == 0
    ran = cli.run("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    admitted = cli.run("use", "admit", "run", "--contract", "k.contract.json", "--json", cwd=tmp_path)
    decision = json.loads(admitted.stdout)
    assert admitted.returncode == 0, (decision["reason"], admitted.stderr)
    assert decision["answer"] == "Admitted"
    assert decision["invariance"]["reference_units_differing"] == 0
    assert decision["invariance"]["candidate_units_differing"] == 0
