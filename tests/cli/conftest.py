"""The command-line tests' shared fixtures: the module's `invar` session and the model its engine commands run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_batch import InvarSession

from invar.engines import DEFAULT_MODEL

CLI_BOUND_S = 120
"""Seconds one command line may take in a module's session, unless the module sets its own `CLI_BOUND_S` (a file
whose commands start engine workers and run them needs more)."""


@pytest.fixture(scope="module")
def cli(request: pytest.FixtureRequest) -> Iterator[InvarSession]:
    """The module's command lines, run one after another in one process (tests/support/cli_batch.py: each as
    `python -m invar.cli` runs it, its own exit status, stdout and stderr, its engine workers started as a user's
    command starts them), so the module pays the CLI's start-up once instead of once per command. Each command is
    bounded by the module's `CLI_BOUND_S`."""
    with InvarSession(bound_s=getattr(request.module, "CLI_BOUND_S", CLI_BOUND_S)) as session:
        yield session


@pytest.fixture(scope="module")
def model() -> Path:
    """The model the engine commands run: the shipped one, or `INVAR_TEST_MODEL`'s."""
    path = Path(os.environ.get("INVAR_TEST_MODEL", str(DEFAULT_MODEL)))
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} holds no model: build it with scripts/train_model.py")
    return path
