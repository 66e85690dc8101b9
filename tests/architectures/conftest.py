"""Small random-weight models of six architecture families (scripts/architecture_table.py builds them), one
worker per engine for the session (vLLM holds one model for its life: one worker per family it runs).

The folders are built once per session (seeded; a few seconds each, mostly transformers' imports)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from invar.engines import start_worker
from invar.transport import WorkerClient

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.append(str(ROOT / "scripts"))

import architecture_table as table  # noqa: E402

CHANGED_THETA = {"full_attention": 40_000.0, "sliding_attention": 5_000.0}
"""Gemma 3's per-layer-type θ in a copy of its folder: neither the folder's nor mlx-lm's defaults (10⁶, 10⁴)."""


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {name: table.build(name, root / name) for name in table.FAMILIES}


@pytest.fixture(scope="session")
def gemma3_changed(family_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the Gemma 3 folder with its per-layer-type rope θ changed (`CHANGED_THETA`)."""
    folder = tmp_path_factory.mktemp("gemma3-theta") / "gemma3"
    shutil.copytree(family_dirs["gemma3"], folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    for layer_type, theta in CHANGED_THETA.items():
        config["rope_parameters"][layer_type]["rope_theta"] = theta
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def _worker(engine: str) -> Iterator[WorkerClient]:
    client = start_worker(engine)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def hf_worker() -> Iterator[WorkerClient]:
    yield from _worker("hf")


@pytest.fixture(scope="session")
def mlx_worker() -> Iterator[WorkerClient]:
    yield from _worker("mlx")


@pytest.fixture(scope="session")
def hf_runs(hf_worker: WorkerClient, family_dirs: dict[str, Path]) -> dict[str, dict[str, object]]:
    """HF's generate and score of every family: the reference."""
    return {name: table.run_one(hf_worker, "hf", folder) for name, folder in family_dirs.items()}
