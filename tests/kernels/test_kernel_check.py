"""`invar kernel check`: the op-level test an agent's kernel usually gets, beside the same comparison on the inputs
the model really feeds the op. A softmax silently computed in bfloat16 passes allclose at 1e-2 on every random
input, and returns NaN on the shipped model's left-padded batch, where fully masked rows reach the op."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

from invar.outputs import KernelCheckOutput
from invar.workers.kernel_check import max_ulp

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kernels"
SCHEMA = ROOT / "docs" / "schemas" / "kernel-check.schema.json"


def test_ulp_distance_counts_representable_floats_across_zero() -> None:
    one = torch.tensor([1.0])
    assert max_ulp(one, one) == 0
    assert max_ulp(one, torch.nextafter(one, torch.tensor([2.0]))) == 1
    tiny = torch.tensor([1e-45])  # the smallest subnormal: one step above +0, two above -tiny
    assert max_ulp(tiny, -tiny) == 2


@pytest.mark.engine
def test_a_precision_downgrade_passes_allclose_and_fails_on_the_models_batch(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "invar.cli", "kernel", "check", str(EXAMPLES / "softmax-bf16"),
                          "--prompts", "4", "--json"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # --json is its published schema's shape, and the model that generated the schema reads it back unchanged
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8"))).validate(report)
    assert KernelCheckOutput.model_validate(report).model_dump(mode="json") == report
    random = report["random"]
    assert random["inputs"] == 5
    assert random["allclose"]["0.01"] == 5  # what a KernelBench-style test accepts
    assert random["allclose"]["0.0001"] == 0
    assert random["nonfinite"] == 0
    assert report["model"]["solo"]["nonfinite"] == 0
    assert report["model"]["batched"]["nonfinite"] > 0  # padded rows of -max: -inf in bfloat16, then NaN
    first = report["first_disagreement"]
    assert first["layout"] == "batched"
    assert first["nonfinite"] is True
    assert "0.01" in first["fails"]
