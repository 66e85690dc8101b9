"""The MLX learner's training checkpoints: the core's check accepts them, a learner resumed from one
takes the uninterrupted step bit for bit, and importance-weight truncation and masking reach its objective
(`tests/workers/learner_checkpoints.py`, shared with the HF learner's tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from invar.tasks import Problem
from invar.transport import WorkerClient

sys.path.insert(0, str(Path(__file__).parents[1]))
import learner_checkpoints as shared

pytestmark = pytest.mark.engine


def test_a_resumed_learner_takes_the_uninterrupted_step(learner: WorkerClient, model_dir: Path, model_digest: str,
                                                        problems: list[Problem], tmp_path: Path) -> None:
    shared.resumed_learner_takes_the_uninterrupted_step("mlx", learner, model_dir, model_digest, problems, tmp_path)


def test_resume_needs_a_training_checkpoint(learner: WorkerClient, model_dir: Path, model_digest: str,
                                            problems: list[Problem], tmp_path: Path) -> None:
    shared.resume_needs_a_training_checkpoint(learner, model_dir, model_digest, problems, tmp_path)


@pytest.mark.parametrize("handling", ["truncate", "mask"])
def test_importance_handling_reaches_the_learners_objective(learner: WorkerClient, model_dir: Path, model_digest: str,
                                                            problems: list[Problem], tmp_path: Path,
                                                            handling: str) -> None:
    shared.importance_handling_reaches_the_learners_objective(learner, model_dir, model_digest, problems, tmp_path,
                                                              handling)
