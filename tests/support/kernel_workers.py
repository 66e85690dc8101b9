"""Kernel folders outside the checkout and the real hf worker that runs one, shared by the kernel tests: a copy of a
fixture or example kernel in a fresh folder (as an agent's kernel would be), the worker's `--patch` argument pinning
it by digest, and a worker started with it on the shipped model. `nan_worker` is the NaN fixture's worker (the
`nan-matmul` kernel: every float32 matrix product NaN), for a test module that also loads `model_dir` and
`model_digest` (tests/workers/conftest.py)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from invar.engines import start_worker
from invar.patches import patch_digest
from invar.protocol import Role
from invar.transport import WorkerClient

TESTS = Path(__file__).resolve().parents[1]
NAN_MATMUL = TESTS / "contract" / "kernels" / "nan-matmul"
"""The NaN fixture: a `patch.py` patch whose matrix products are NaN, so the model's log-probabilities are too."""

sys.path.insert(0, str(TESTS / "workers" / "hf"))
from hf_calls import load_params  # noqa: E402


def outside(source: Path, into: Path, name: str | None = None) -> Path:
    """A copy of the kernel folder `source` in `into` (a folder outside the checkout), named `name` or as `source`."""
    folder = into / (name or source.name)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


def patch_args(folder: Path, *extra: str) -> list[str]:
    """The worker's arguments that run the kernel at `folder`, pinned by its digest."""
    return ["--patch", f"{folder}={patch_digest(folder)}", *extra]


def hf_worker(args: list[str], model: Path, digest: str) -> Iterator[WorkerClient]:
    """An hf inference worker started with `args`, the model at `model` loaded; closed when the caller is done."""
    client = start_worker("hf", Role.INFERENCE, args=args)
    try:
        client.call("load_model", load_params(model, digest))
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def nan_worker(tmp_path_factory: pytest.TempPathFactory, model_dir: Path,
               model_digest: str) -> Iterator[WorkerClient]:
    """The hf worker running the NaN fixture from a folder outside the checkout, the shipped model loaded."""
    folder = outside(NAN_MATMUL, tmp_path_factory.mktemp("elsewhere"))
    yield from hf_worker(patch_args(folder), model_dir, model_digest)
