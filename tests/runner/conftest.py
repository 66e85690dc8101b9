"""The local Ray cluster the `--ray` tests share (one per session: its start takes seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_cluster import local_cluster


@pytest.fixture(scope="session")
def cluster_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's folder: Ray's files, and its node's fork servers' sockets and `forkserver.log`."""
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="session")
def cluster(cluster_home: Path) -> Iterator[str]:
    with local_cluster(cluster_home) as address:
        yield address
