"""bench/learner_memory.py on the shipped model, small: one learner step through the HF worker, its peak RSS read
from the worker's /proc entry, and the proximal log-probabilities it saves are the ones its report digests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from invar import canonical
from invar.engines import DEFAULT_MODEL

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


def test_one_learner_step_is_measured_and_its_values_saved(tmp_path: Path) -> None:
    saved = tmp_path / "proximal.npy"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "learner_memory.py"), "--model", str(DEFAULT_MODEL),
                          "--prompts", str(ROOT / "data" / "arith-train.jsonl"), "--rows", "4", "--tokens", "3",
                          "--out", str(tmp_path / "adapters"), "--save", str(saved)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert (report["rows"], report["tokens"]) == (4, 3)
    assert 0 < report["peak_rss_after_load_gb"] <= report["peak_rss_step_gb"]
    assert report["step_s"] > 0
    proximal = np.load(saved)
    assert proximal.dtype == np.float32
    assert proximal.shape == (12,)
    assert bool(np.all(proximal < 0))
    assert report["proximal_digest"] == canonical.sha256(proximal.tobytes())
    assert (tmp_path / "adapters" / "step1").is_dir()  # the step saved its checkpoint where it was told


def test_the_mlx_learner_with_openblas_is_measured_under_its_identity(tmp_path: Path) -> None:
    """`--engine mlx --setting blas=openblas`: the same step through the MLX learner started with OpenBLAS (the
    worker starts itself again with the library preloaded, so its /proc entry is the process that stepped)."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "learner_memory.py"), "--model", str(DEFAULT_MODEL),
                          "--prompts", str(ROOT / "data" / "arith-train.jsonl"), "--rows", "4", "--tokens", "3",
                          "--out", str(tmp_path / "adapters"), "--engine", "mlx", "--setting", "blas=openblas"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert (report["engine"], report["settings"]) == ("mlx", {"blas": "openblas"})
    assert 0 < report["peak_rss_after_load_gb"] <= report["peak_rss_step_gb"]
    assert (tmp_path / "adapters" / "step1" / "adapters.safetensors").is_file()  # the MLX learner's format
