"""The candidate patches' tests: their kernels on their own (fast, torch only), and patched workers on the real engines.

The shipped model, its digest and the evaluation population are the fixtures of `tests/workers/conftest.py`, loaded
from that file (conftest fixtures only reach their own folder); the calls and comparisons are `tests/workers/hf/
hf_calls.py`'s. Each patched worker is started once per test session, on first use, with the model loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from invar.engines import start_worker
from invar.protocol import Role
from invar.transport import WorkerClient

_WORKER_TESTS = Path(__file__).resolve().parents[1] / "workers"
sys.path.insert(0, str(_WORKER_TESTS / "hf"))

# Importable once the path above is set.
from hf_calls import load_params  # noqa: E402
from patch_helpers import load_module, patch_args  # noqa: E402

_shared = load_module(_WORKER_TESTS / "conftest.py", "invar_tests_workers_conftest")
model_dir = _shared.model_dir
model_digest = _shared.model_digest
problems = _shared.problems


def _worker(engine: str, args: list[str], model: Path, digest: str,
            quantization: str = "none") -> Iterator[WorkerClient]:
    client = start_worker(engine, Role.INFERENCE, args=args)
    try:
        client.call("load_model", load_params(model, digest, quantization))
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def hf_stock(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    """The unpatched Hugging Face inference worker (FP32), the reference the patched ones are compared with."""
    yield from _worker("hf", [], model_dir, model_digest)


@pytest.fixture(scope="session")
def hf_fixed_block(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from _worker("hf", patch_args("fixed-block"), model_dir, model_digest)


@pytest.fixture(scope="session")
def hf_fixed_block_nf4(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    """fixed-block over NF4 weights (bitsandbytes' product is one opaque op the patch must take over)."""
    yield from _worker("hf", patch_args("fixed-block"), model_dir, model_digest, "nf4")


@pytest.fixture(scope="session")
def hf_split_k(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from _worker("hf", patch_args("split-k"), model_dir, model_digest)


@pytest.fixture(scope="session")
def hf_fixed_block_poisoned(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from _worker("hf", patch_args("fixed-block", poison=True), model_dir, model_digest)


@pytest.fixture(scope="session")
def vllm_fixed_block(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from _worker("vllm", patch_args("fixed-block"), model_dir, model_digest)


@pytest.fixture(scope="session")
def vllm_split_k(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from _worker("vllm", patch_args("split-k"), model_dir, model_digest)
