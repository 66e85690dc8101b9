"""The Hugging Face learner's training checkpoints: the core's check accepts them, a learner resumed from one
takes the uninterrupted step bit for bit, and importance-weight truncation and masking reach its objective
(`tests/workers/learner_checkpoints.py`, shared with the MLX learner's tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from invar import canonical
from invar.tasks import Problem
from invar.transport import WorkerClient

sys.path.insert(0, str(Path(__file__).parents[1]))
import learner_checkpoints as shared

pytestmark = pytest.mark.engine


def test_a_resumed_learner_takes_the_uninterrupted_step(learner: WorkerClient, model_dir: Path, model_digest: str,
                                                        problems: list[Problem], tmp_path: Path) -> None:
    shared.resumed_learner_takes_the_uninterrupted_step("hf", learner, model_dir, model_digest, problems, tmp_path)


def test_resume_needs_a_training_checkpoint(learner: WorkerClient, model_dir: Path, model_digest: str,
                                            problems: list[Problem], tmp_path: Path) -> None:
    shared.resume_needs_a_training_checkpoint(learner, model_dir, model_digest, problems, tmp_path)


@pytest.mark.parametrize("handling", ["truncate", "mask"])
def test_importance_handling_reaches_the_learners_objective(learner: WorkerClient, model_dir: Path, model_digest: str,
                                                            problems: list[Problem], tmp_path: Path,
                                                            handling: str) -> None:
    shared.importance_handling_reaches_the_learners_objective(learner, model_dir, model_digest, problems, tmp_path,
                                                              handling)


REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout these tests belong to

_WRITE = """
import sys
from pathlib import Path
import torch
from invar.workers.hf_worker import Adapter, _write_checkpoint

modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
a = Adapter({}, 4, 8.0, modules, None)
_write_checkpoint(Path(sys.argv[1]), {"w": torch.zeros(2)}, {"m": torch.zeros(2)}, a, "0" * 64)
print(list(set(modules)))  # the order a set of them has in this process, as peft's has
"""


def test_a_checkpoints_bytes_do_not_depend_on_the_processs_hash_seed(tmp_path: Path) -> None:
    """peft holds target_modules as a set; written as it comes, one adapter had a spelling (a digest) per process.
    Two processes whose hash seeds order that set differently (each says how it ordered it) write the same bytes."""
    digests, orders = set(), set()
    for seed in range(2):
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        out = subprocess.run([sys.executable, "-c", _WRITE, str(folder)], cwd=REPO_ROOT, capture_output=True,
                             text=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}, timeout=300)
        assert out.returncode == 0, out.stderr
        digests.add(canonical.tree_digest(folder))
        orders.add(out.stdout.splitlines()[-1])
    assert len(orders) == 2  # the set came in two orders
    assert len(digests) == 1
