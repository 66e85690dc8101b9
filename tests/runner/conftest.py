"""The local Ray cluster the `--ray` tests share (one per session: its start takes seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_cluster import local_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_cluster(tmp_path_factory.mktemp("ray")) as address:
        yield address
