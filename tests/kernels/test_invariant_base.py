"""The batch-invariant base (`patches/invariant-*`: one function kernel per op) on the real Hugging Face worker and
the shipped tiny model: with it the engine gives a prompt the same bits alone, in a batch or shuffled, where the
stock engine does not; and the base routes around a kernel that replaces one of its ops."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "workers" / "hf"))
sys.path.insert(0, str(_TESTS / "patches"))

from hf_calls import bit_identical, make_requests  # noqa: E402
from patch_helpers import bit_equal_share, layouts, load_module, run  # noqa: E402
from support.kernel_workers import hf_worker, outside  # noqa: E402

from invar.patches import patch_digest  # noqa: E402
from invar.transport import WorkerClient  # noqa: E402

_shared = load_module(_TESTS / "workers" / "conftest.py", "invar_tests_kernels_base_workers_conftest")
model_dir = _shared.model_dir
model_digest = _shared.model_digest
problems = _shared.problems

pytestmark = pytest.mark.engine

BASE = ("invariant-matmul", "invariant-softmax", "invariant-log-softmax", "invariant-rms-norm")
N = 24


def _args(*names: str) -> list[str]:
    return [arg for name in names for arg in ("--patch", f"{name}={patch_digest(name)}")]


@pytest.fixture(scope="module")
def base_worker(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from hf_worker(_args(*BASE), model_dir, model_digest)


@pytest.fixture(scope="module")
def stock_eager(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from hf_worker(["--attn-implementation", "eager"], model_dir, model_digest)


def _runs(worker: WorkerClient, requests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: run(worker, requests, layout) for name, layout in layouts(len(requests)).items()}


def test_the_base_makes_the_tiny_model_batch_invariant(base_worker: WorkerClient, stock_eager: WorkerClient,
                                                       problems: list[Any]) -> None:
    requests = make_requests(problems[:N], seed=1000, temperature=1.0)
    assert base_worker.identity.settings["attn_implementation"] == "eager"
    runs = _runs(base_worker, requests)
    first = runs["one batch"]["outputs"]
    for name, result in runs.items():
        assert all(result["patch_calls"][k] > 0 for k in BASE), (name, result["patch_calls"])
        assert bit_identical([o["tokens"] for o in result["outputs"]], [o["tokens"] for o in first]), name
        assert bit_identical([o["logprobs"] for o in result["outputs"]], [o["logprobs"] for o in first]), name
    stock = _runs(stock_eager, requests)
    share, differ = bit_equal_share(stock["one batch"]["outputs"], stock["one by one"]["outputs"])
    print(f"measured: stock eager, one batch of {N} vs one by one: {100 * share:.1f} % of log-probs bit-equal, "
          f"{differ} requests with other tokens; the base: 100 % in every layout")
    assert share < 1.0 or differ > 0  # the stock engine is not batch invariant here: the base is what makes it so


def _softmax_on_base(folder: Path, model: Path, digest: str) -> Iterator[WorkerClient]:
    """The base less its softmax, and the softmax kernel at `folder`: the candidate `use init` proposes for it."""
    yield from hf_worker([*_args("invariant-matmul", "invariant-log-softmax", "invariant-rms-norm"),
                          "--patch", f"{folder}={patch_digest(folder)}"], model, digest)


@pytest.mark.parametrize(("kernel", "invariant"), [
    # fixed-block's softmax written as an agent's kernel: its row sum is anchored at the row's end
    (_TESTS.parent / "patches" / "invariant-softmax", True),
    # the textbook softmax: a correct float32 softmax whose stock row sum changes bits with the left padding a
    # batch gives a prompt (the attention rows grow by masked positions), so it adds layout dependence on the base
    (_TESTS.parent / "examples" / "kernels" / "softmax-fp32", False),
])
def test_on_the_base_only_what_the_softmax_kernel_adds_varies(tmp_path: Path, model_dir: Path, model_digest: str,
                                                              problems: list[Any], kernel: Path,
                                                              invariant: bool) -> None:
    folder = outside(kernel, tmp_path, "my-softmax")
    requests = make_requests(problems[:16], seed=1000, temperature=1.0)
    for worker in _softmax_on_base(folder, model_dir, model_digest):
        batch = run(worker, requests, [list(range(16))])
        alone = run(worker, requests, [[i] for i in range(16)])
        assert batch["patch_calls"][str(folder)] > 0
        same = bit_identical([o["logprobs"] for o in batch["outputs"]], [o["logprobs"] for o in alone["outputs"]])
        assert same is invariant
