"""The Hugging Face worker's tests: one worker per role and configuration, started once per test session.

Every test runs the real engine on the shipped model (`invar.engines.DEFAULT_MODEL`); the model, vocabulary and
population fixtures are in `tests/workers/conftest.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hf_calls import load_params

from invar.engines import start_worker
from invar.protocol import Role
from invar.transport import WorkerClient


def _worker(role: Role, model_dir: Path, digest: str, quantization: str) -> Iterator[WorkerClient]:
    client = start_worker("hf", role)
    try:
        client.call("load_model", load_params(model_dir, digest, quantization))
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def inference(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    """An inference worker with the FP32 model loaded (tests must leave it loaded as it is)."""
    yield from _worker(Role.INFERENCE, model_dir, model_digest, "none")


@pytest.fixture(scope="session")
def learner(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    """A learner over the FP32 base; its first learner_step makes a fresh adapter."""
    yield from _worker(Role.LEARNER, model_dir, model_digest, "none")


@pytest.fixture(scope="session")
def nf4_learner(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    """A learner over the NF4-quantized base (it also serves score)."""
    yield from _worker(Role.LEARNER, model_dir, model_digest, "nf4")
