"""The Hugging Face worker's tests: one worker per role and configuration, started once per test session.

Every test runs the real engine on the shipped model (`invar.engines.DEFAULT_MODEL`); `INVAR_TEST_MODEL` may name
another model folder of the same recipe while the shipped one is being rebuilt.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hf_calls import load_params

from invar import canonical
from invar.engines import DEFAULT_MODEL, REPO_ROOT, start_worker
from invar.protocol import Role, WorkerClient
from invar.tasks import Problem, Vocabulary, load_population

EVAL_POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    path = Path(os.environ.get("INVAR_TEST_MODEL", str(DEFAULT_MODEL)))
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} holds no model: build it with scripts/train_model.py")
    return path


@pytest.fixture(scope="session")
def model_digest(model_dir: Path) -> str:
    return canonical.tree_digest(str(model_dir))


@pytest.fixture(scope="session")
def vocab(model_dir: Path) -> Vocabulary:
    return Vocabulary.from_model_dir(model_dir)


@pytest.fixture(scope="session")
def problems() -> list[Problem]:
    digest = EVAL_POPULATION.with_suffix(".sha256").read_text().split()[0]
    return load_population(EVAL_POPULATION, digest)


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
