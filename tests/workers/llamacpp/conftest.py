"""One llama.cpp worker per test session on the shipped SmolLM2-135M-Instruct Q4_1 GGUF, and the core's tokenizer
of that folder.

The GGUF folder (`models/smollm2-135m-instruct-q4_1`: the GGUF file beside the tokenizer files) is built or checked
against its pins by `scripts/build_smollm2.py`, as tests/models does. The shipped tiny model is not used here: its
character-level WordLevel vocabulary has no GGUF tokenizer model llama.cpp reads, so the GGUF engine is tested on
the real model it exists for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from invar import canonical
from invar.engines import start_worker
from invar.tasks import ModelTokenizer
from invar.transport import WorkerClient


@pytest.fixture(scope="session")
def gguf_dir(smollm2_build: tuple[Path, Path, Path]) -> Path:
    """The pinned GGUF folder, built (or checked) by the build script; a build that cannot run fails the test."""
    return smollm2_build[2]


@pytest.fixture(scope="session")
def gguf_tok(gguf_dir: Path) -> ModelTokenizer:
    return ModelTokenizer.from_model_dir(gguf_dir)


@pytest.fixture(scope="session")
def load_params(gguf_dir: Path) -> dict[str, Any]:
    return {"model_dir": str(gguf_dir), "model_digest": canonical.tree_digest(gguf_dir), "dtype": "float32",
            "quantization": "none", "adapter": None}


@pytest.fixture(scope="session")
def worker(load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    """The session's llama.cpp worker with the GGUF loaded (its start-up is printed)."""
    started = time.perf_counter()
    client = start_worker("llamacpp")
    try:
        handshake = time.perf_counter()
        client.call("load_model", load_params)
        print(f"measured: worker start {handshake - started:.1f} s, load_model {time.perf_counter() - handshake:.1f} s")
        yield client
    finally:
        client.close()
