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

from invar import canonical
from invar.engines import DEFAULT_MODEL, REPO_ROOT, start_worker
from invar.protocol import Role, WorkerClient
from invar.tasks.arithmetic import Problem, load_population
from invar.tasks.vocabulary import Vocabulary

EVAL_FILE = REPO_ROOT / "data" / "arith-eval.jsonl"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.fail(f"{DEFAULT_MODEL} is missing: build the shipped model with scripts/train_model.py")
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def load_params(model_dir: Path) -> dict[str, Any]:
    """`load_model` params for the shipped model in float32."""
    return {"model_dir": str(model_dir), "model_digest": canonical.tree_digest(model_dir), "dtype": "float32",
            "quantization": "none", "adapter": None}


@pytest.fixture(scope="session")
def vocab(model_dir: Path) -> Vocabulary:
    return Vocabulary.from_model_dir(model_dir)


@pytest.fixture(scope="session")
def problems() -> list[Problem]:
    """The evaluation population (the task's declared prompts)."""
    return load_population(EVAL_FILE, EVAL_FILE.with_suffix(".sha256").read_text().split()[0])


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
