"""The real pretrained model, SmolLM2-135M-Instruct, built once per test session by `scripts/build_smollm2.py`
(the `smollm2_build` fixture of tests/conftest.py).

The script is a no-op when `models/` already holds the folders and they match the pins, so only the first session
on a machine pays the download and the dequantization (about 45 s and 1.3 GB of memory here).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_build: tuple[Path, Path, Path]) -> Path:
    """The SmolLM2-135M-Instruct folder (float32 safetensors, its tokenizer and chat template), pinned."""
    return smollm2_build[0]


@pytest.fixture(scope="session")
def smollm2_mlx_dir(smollm2_build: tuple[Path, Path, Path]) -> Path:
    """The same model for mlx-lm: config.json with a top-level rope_theta, every other file the same."""
    return smollm2_build[1]
