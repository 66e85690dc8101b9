"""Use declarations the benchmarks write for the shipped model on Hugging Face: identities probed from the installed
worker, one pairing layout of batches of 16, no invariance layouts (`bench/workers.py`, `bench/run_memory.py`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.runner.engine import Engine, probe_identity

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout this bench belongs to

POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def hf_package(threads: int = 1, quantization: str = "none") -> dict[str, Any]:
    """The shipped model on the HF worker with `threads` threads, as a contract's package states it."""
    ident = probe_identity(Engine.HF, {"threads": threads})
    return {"engine": "hf", "engine_version": ident.engine_version, "settings": ident.settings,
            "model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
            "dtype": "float32", "quantization": quantization}


def write_declaration(folder: Path, name: str, *, units: int, per_call: int, epsilon: str, seed: int,
                      reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> Path:
    """`folder/name.toml`: `units` seeded prompts at T = 1, decided by paired-binary-score."""
    lines = [
        f'name = "{name}"',
        "[population]", f'path = "{POPULATION}"',
        f'sha256 = "{POPULATION.with_suffix(".sha256").read_text().split()[0]}"', f"sample = {units}",
        "[scorer]", 'name = "arithmetic-exact"',
        "[sampling]", "temperature = 1.0", "max_tokens = 5",
        "[requirement]", 'standard = "population"', f'epsilon = "{epsilon}"', 'confidence = "0.95"',
        'method = "paired-binary-score"',
        "[pairing]", f"seed = {seed}", 'layout = "b16"',
        "[layouts.b16]", "batch_size = 16",
        "[invariance]", "required = false",
        "[execution]", f"requests_per_call = {per_call}",
        "[reference]", *(f"{k} = {_toml(v)}" for k, v in reference.items()),
        "[candidate]", *(f"{k} = {_toml(v)}" for k, v in candidate.items()),
    ]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
