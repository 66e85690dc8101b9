"""The real pretrained model, SmolLM2-135M-Instruct, built once per test session by `scripts/build_smollm2.py`.

The script is a no-op when `models/` already holds both folders and they match the pins, so only the first session
on a machine pays the download and the dequantization (about 45 s and 1.3 GB of memory here). A build that cannot
run fails the test with the script's own message; it is never skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_smollm2.py"
MODELS = REPO_ROOT / "models"
PINS = MODELS / "smollm2-135m-instruct.pins.json"
SMOLLM2 = MODELS / "smollm2-135m-instruct"
SMOLLM2_MLX = MODELS / "smollm2-135m-instruct-mlx"


@pytest.fixture(scope="session")
def smollm2_build() -> tuple[Path, Path]:
    """Both folders (the model, its mlx-lm copy), built or checked against the pins by the build script."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(BUILD_SCRIPT)], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        pytest.fail(f"{BUILD_SCRIPT.name} exited {done.returncode}: {' | '.join(lines[-3:])}", pytrace=False)
    return SMOLLM2, SMOLLM2_MLX


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_build: tuple[Path, Path]) -> Path:
    """The SmolLM2-135M-Instruct folder (float32 safetensors, its tokenizer and chat template), pinned."""
    return smollm2_build[0]


@pytest.fixture(scope="session")
def smollm2_mlx_dir(smollm2_build: tuple[Path, Path]) -> Path:
    """The same model for mlx-lm: config.json with a top-level rope_theta, every other file the same."""
    return smollm2_build[1]
