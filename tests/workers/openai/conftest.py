"""One real OpenAI-compatible server per test session (`openai_server`): vLLM's own, serving the shipped model on
127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_server import VllmServer, free_port, start_server, stop_server


@pytest.fixture(scope="session")
def vllm_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    started = time.perf_counter()
    server = start_server(model_dir, free_port(), log)
    print(f"measured: vLLM server up in {time.perf_counter() - started:.1f} s")
    try:
        yield server
    finally:
        stop_server(server)
