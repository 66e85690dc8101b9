"""One MLX inference worker and one MLX learner per test session (engine start-up is the slow part).

Both load the shipped model, `invar.engines.DEFAULT_MODEL`. Tests share the two processes, so a test that
changes what a worker holds (adapters, the learner's adapter under training, the dtype) reloads the model
first or uses adapter names of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from invar.engines import start_worker
from invar.protocol import Role
from invar.transport import WorkerClient


@pytest.fixture(scope="session")
def load_params(model_dir: Path, model_digest: str) -> dict[str, Any]:
    """`load_model` params for the shipped model in float32."""
    return {"model_dir": str(model_dir), "model_digest": model_digest, "dtype": "float32",
            "quantization": "none", "adapter": None}


def _start(role: Role, load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    worker = start_worker("mlx", role)
    try:
        worker.call("load_model", load_params)
        yield worker
    finally:
        worker.close()


@pytest.fixture(scope="session")
def inference(load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    yield from _start(Role.INFERENCE, load_params)


@pytest.fixture(scope="session")
def learner(load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    yield from _start(Role.LEARNER, load_params)
