"""What every engine worker's tests share: the shipped model, its tokenizer (the core's), and the evaluation population.

Each engine's own conftest starts its workers once per test session on top of these.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.tasks import ModelTokenizer, Problem, load_population

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

EVAL_POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.fail(f"{DEFAULT_MODEL} holds no model: build it with scripts/train_model.py")
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def model_digest(model_dir: Path) -> str:
    return canonical.tree_digest(model_dir)


@pytest.fixture(scope="session")
def vocab(model_dir: Path) -> ModelTokenizer:
    """The core's tokenizer of the shipped model: it decodes responses for the scorer and encodes prompts."""
    return ModelTokenizer.from_model_dir(model_dir)


@pytest.fixture(scope="session")
def problems() -> list[Problem]:
    """The evaluation population (the task's declared prompts)."""
    return load_population(EVAL_POPULATION, EVAL_POPULATION.with_suffix(".sha256").read_text().split()[0])
