"""Shared fixtures: paths of the repository and the worker command lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Engines must never reach for a hub: every model is the project's own.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def python_argv(*args: str) -> list[str]:
    """A command line that runs this interpreter with the repository importable."""
    return [sys.executable, *args]
