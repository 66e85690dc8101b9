"""`invar kernel check`: the op-level test an agent's kernel usually gets, beside the same comparison on the inputs
the model really feeds the op, and the same tensors called again. A softmax silently computed in bfloat16 passes
allclose at 1e-2 on every random input, and returns NaN on the model's left-padded batch, where fully masked rows
reach the op (on the tiny model's prompts and on SmolLM2's chats, rendered by its chat template). A matmul that
caches its products by shapes and the weight's data pointer passes every new call bit for bit, random or the
model's, and is caught only when called again on the same tensors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from invar.cli.outputs import KernelCheckOutput
from invar.tasks.population import load_units
from invar.workers.kernel_check import max_ulp

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kernels"
SCHEMA = ROOT / "docs" / "schemas" / "kernel-check.schema.json"


def kernel_check(cwd: Path, *args: str) -> dict[str, Any]:
    """`invar kernel check ARGS --json`'s report, checked against its published schema and read back unchanged by
    the model that generated it."""
    out = subprocess.run([sys.executable, "-m", "invar.cli", "kernel", "check", *args, "--json"], capture_output=True,
                         text=True, timeout=600, cwd=cwd)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8"))).validate(report)
    assert KernelCheckOutput.model_validate(report).model_dump(mode="json") == report
    return report


def test_ulp_distance_counts_representable_floats_across_zero() -> None:
    one = torch.tensor([1.0])
    assert max_ulp(one, one) == 0
    assert max_ulp(one, torch.nextafter(one, torch.tensor([2.0]))) == 1
    tiny = torch.tensor([1e-45])  # the smallest subnormal: one step above +0, two above -tiny
    assert max_ulp(tiny, -tiny) == 2


@pytest.mark.engine
def test_a_precision_downgrade_passes_allclose_and_fails_on_the_models_batch(tmp_path: Path) -> None:
    report = kernel_check(tmp_path, str(EXAMPLES / "softmax-bf16"), "--prompts", "4")
    random = report["random"]
    assert random["inputs"] == 5
    assert random["allclose"]["0.01"] == 5  # what a KernelBench-style test accepts
    assert random["allclose"]["0.0001"] == 0
    assert random["nonfinite"] == 0
    assert report["steps"] == 2
    assert report["model"]["solo"]["nonfinite"] == 0
    assert report["model"]["batched"]["nonfinite"] > 0  # padded rows of -max: -inf in bfloat16, then NaN
    first = report["first_disagreement"]
    assert first["layout"] == "batched"
    assert first["nonfinite"] is True
    assert "0.01" in first["fails"]
    # it remembers nothing: called again, it answers as a new call does (NaN included, where the same input gave it)
    reuse = report["reuse"]
    assert reuse["repeated"]["inputs"] == 25
    assert reuse["repeated"]["allclose"]["0.01"] == 25
    assert reuse["first_disagreement"] is None


@pytest.mark.engine
def test_a_cached_product_passes_every_new_call_and_is_caught_called_again(tmp_path: Path) -> None:
    report = kernel_check(tmp_path, str(EXAMPLES / "matmul-cached"), "--prompts", "4")
    random, model = report["random"], report["model"]
    # every new call is exact: a random shape is new, a captured input is a copy with pointers of its own
    assert random["bit_identical"] == random["inputs"] == 5
    for layout in ("solo", "batched"):
        assert model[layout]["inputs"] > 0
        assert model[layout]["bit_identical"] == model[layout]["inputs"]
    assert report["first_disagreement"] is None
    reuse = report["reuse"]
    # the same weight object with fresh activations gets the first call's product back
    first = reuse["first_disagreement"]
    assert first["layout"] == "in-place"
    assert first["fails"] == ["0.0001", "0.01"]
    assert reuse["repeated"]["allclose"]["0.01"] == 5  # only each input's first call is right
    # in the model's order with the model's own weights, the decode steps' products repeat shapes and hit the cache
    replay = reuse["replay"]
    assert reuse["weights_kept"] == replay["inputs"] == model["solo"]["inputs"] + model["batched"]["inputs"]
    assert 0 < replay["allclose"]["0.01"] < replay["inputs"]


@pytest.mark.engine
def test_a_chat_model_is_checked_on_its_rendered_chats(tmp_path: Path, smollm2_build: tuple[Path, Path, Path]
                                                        ) -> None:
    model = smollm2_build[0]
    population = ROOT / "data" / "chat-eval.jsonl"
    assert load_units(population)[0].messages is not None  # the chat population: units with messages, no prompt
    report = kernel_check(tmp_path, str(EXAMPLES / "softmax-bf16"), "--model", str(model), "--population",
                          str(population), "--prompts", "2", "--steps", "1")
    assert report["prompts"] == 2
    # eager attention's softmax once per layer (30) and forward: the prefill and one step, each chat alone and both
    # together
    assert report["model"]["solo"]["inputs"] == 2 * 2 * 30
    assert report["model"]["batched"]["inputs"] == 2 * 30
    assert report["model"]["batched"]["nonfinite"] == 30  # the shorter chat's padding in every layer's prefill
    assert report["model"]["solo"]["nonfinite"] == 0
    assert report["first_disagreement"] is not None
