"""The gallery of agent-style kernels (examples/kernels, docs/kernels.md): each hack really is the hack its
kernel.toml names, what the op-level check says of it (the KernelBench-style random test, and the same comparison on
the inputs the shipped tiny model feeds the op), and one hack that the random test accepts caught end to end by the
contract `use init --candidate-patch` proposes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from invar.formats.tokenizer import ModelTokenizer
from invar.patches import patch_digest
from invar.tasks.population import load_units
from invar.workers.common import load_patches
from invar.workers.kernel_check import check
from invar.workers.kernel_host import FunctionKernel

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "kernels"
MODEL = REPO / "models" / "tiny-arith"


def _load(name: str) -> FunctionKernel:
    folder = EXAMPLES / name
    ref = str(folder)
    kernel = load_patches([f"{ref}={patch_digest(folder)}"], [], [f"{ref}={ref}"]).modules[ref]
    assert isinstance(kernel, FunctionKernel)
    kernel.self_check()  # what the worker runs at start: every gallery kernel passes it
    return kernel


def test_every_gallery_kernel_names_its_class() -> None:
    classes = {"batch-invariant", "batch-variant", "in bfloat16", "stale or cached output", "shape-specialised",
               "approximated transcendental", "nondeterministic reduction order"}
    for folder in sorted(EXAMPLES.iterdir()):
        description = tomllib.loads((folder / "kernel.toml").read_text())["description"]
        assert any(c in description.lower() for c in classes), folder.name


# -- each hack is the hack it says it is -------------------------------------------------------------------------


def test_the_cached_matmul_returns_a_stale_product_for_new_activations() -> None:
    matmul = _load("matmul-cached").function
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 8, generator=g)
    first, second = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    assert torch.equal(matmul(first, weight), first @ weight)
    assert torch.equal(matmul(second, weight), first @ weight)  # the first call's product, not the second's
    assert torch.equal(matmul(second[:3], weight), second[:3] @ weight)  # a new shape is computed


def test_the_tall_tail_matmul_is_exact_up_to_64_rows_and_zero_on_the_tail() -> None:
    matmul = _load("matmul-tall-tail").function
    g = torch.Generator().manual_seed(0)
    b = torch.randn(32, 8, generator=g)
    short, tall = torch.randn(64, 32, generator=g), torch.randn(72, 32, generator=g)
    assert torch.equal(matmul(short, b), short @ b)
    out = matmul(tall, b)
    assert torch.equal(out[:64], tall[:64] @ b)
    assert bool((out[64:] == 0).all())
    assert not bool((tall[64:] @ b == 0).all())


def test_the_polynomial_exp_softmax_is_within_1e_2_and_not_1e_4() -> None:
    softmax = _load("softmax-poly-exp").function
    x = 3 * torch.randn(8, 128, generator=torch.Generator().manual_seed(0))
    err = float((softmax(x, -1) - torch.softmax(x, -1)).abs().max())
    assert 1e-4 < err < 1e-2


def test_the_random_split_matmul_gives_other_bits_for_the_same_input() -> None:
    matmul = _load("matmul-random-split").function
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 256, generator=g), torch.randn(256, 16, generator=g)
    results = [matmul(a, b) for _ in range(20)]
    assert all(torch.allclose(r, a @ b, atol=1e-4, rtol=1e-4) for r in results)
    assert len({r.numpy().tobytes() for r in results}) > 1


# -- the op-level check: what the random test accepts, what the model's inputs show ---------------------------------

# name: (random allclose at 1e-2 on all, at 1e-4 on all, where the model's inputs first disagree: None or
# (layout, what fails), where the reuse probe first disagrees: None or the probe)
VERDICTS: dict[str, tuple[bool, bool, tuple[str, str] | None, str | None]] = {
    "softmax-fp32": (True, True, None, None),
    "silu-fp32": (True, True, None, None),
    "softmax-bf16": (True, False, ("batched", "0.01"), None),  # NaN on fully masked padded rows
    "softmax-poly-exp": (True, False, None, None),  # its error is the same kind on the model's rows as on random ones
    # the captured inputs are copies: new pointers, so the cache never hits; called again on the same weight, it does
    "matmul-cached": (True, True, None, "in-place"),
    "matmul-tall-tail": (True, True, ("batched", "0.01"), None),  # 8 prompts of 9 tokens: 72 rows, 8 left zero
    "matmul-random-split": (True, True, None, None),  # every result is a correct float32 product up to rounding
}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """The first 8 units' token ids as `invar kernel check` sends them (the core's tokenizer)."""
    vocab = ModelTokenizer.from_model_dir(MODEL)
    return [vocab.unit_prompt(unit)[1] for unit in load_units(REPO / "data" / "arith-eval.jsonl")[:8]]


@pytest.mark.engine
@pytest.mark.parametrize("name", list(VERDICTS))
def test_op_level_verdicts(name: str, prompts: list[list[int]]) -> None:
    random_all_1e2, random_all_1e4, caught, reused = VERDICTS[name]
    report: dict[str, Any] = check(_load(name), MODEL, prompts, trials=5, steps=2, repeats=2)
    random = report["random"]
    assert random["inputs"] == 5
    assert (random["allclose"]["0.01"] == 5) is random_all_1e2
    assert (random["allclose"]["0.0001"] == 5) is random_all_1e4
    assert report["model"]["solo"]["inputs"] > 0
    assert report["model"]["batched"]["inputs"] > 0
    first = report["first_disagreement"]
    if caught is None:
        assert first is None
    else:
        assert first is not None
        assert first["layout"] == caught[0]
        assert caught[1] in first["fails"]
    again = report["reuse"]["first_disagreement"]
    assert (again and again["layout"]) == reused


# -- end to end: a hack the random test accepts, caught by the proposed contract --------------------------------


@pytest.mark.engine
def test_the_cached_matmul_is_violated_end_to_end(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "matmul-cached", tmp_path / "matmul-cached")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}

    def invar(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "invar.cli", *args], capture_output=True, text=True,
                              timeout=900, cwd=tmp_path, env=env)

    made = invar("use", "init", "k.toml", "--candidate-patch", "./matmul-cached", "--sample", "12", "--temperature",
                 "0", "--epsilon", "0.5")
    assert made.returncode == 0, made.stderr
    assert invar("use", "prepare", "k.toml").returncode == 0
    ran = invar("use", "run", "k.contract.json", "--run", "run")
    assert ran.returncode == 0, ran.stderr
    admitted = invar("use", "admit", "run", "--contract", "k.contract.json", "--json")
    assert admitted.returncode == 10, admitted.stderr
    decision = json.loads(admitted.stdout)
    assert decision["answer"] == "Violated"
    # The stale products move the distributions far beyond max_kl (the first requirement that fails: a fresh worker
    # fed the same calls hits its cache the same way, so determinism need not see it) ...
    assert decision["reason"].startswith("measurements: "), decision["reason"]
    assert decision["measurements"]["requirement"]["violated"] is True
    # ... and the task beyond what the contract allows.
    assert decision["task_loss"]["worse"] > decision["task_loss"]["better"]
