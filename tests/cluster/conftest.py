"""The multi-node Ray cluster the tests of this folder share (one per session: four Ray nodes take a minute)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from netns_cluster import ClusterError, NetnsCluster, netns_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces are Linux's: a multi-node cluster on one machine cannot be made here")
    try:
        with netns_cluster(tmp_path_factory.mktemp("ray")) as made:
            yield made
    except ClusterError as exc:  # on Linux a missing privilege is a failure of the test run, never a skip
        pytest.fail(f"the multi-node test cluster could not be made: {exc}", pytrace=False)
