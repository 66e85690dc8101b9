"""The benchmarks measure what a user's command costs by default: every worker a fresh process, never one forked by
the suite's fork servers (`INVAR_FORKSERVER`, set by scripts/test_lanes.py)."""

from __future__ import annotations

import pytest

from invar.transport import forkserver


@pytest.fixture(autouse=True)
def _fresh_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(forkserver.ENV, raising=False)
