"""What the patch tests share: a patch's code on its own, a patched worker's arguments, batch layouts and how runs
are compared."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from hf_calls import max_abs_diff

from invar.patches import PATCHES_DIR, patch_digest
from invar.transport import WorkerClient


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_patch(name: str) -> ModuleType:
    """A patch's code as a module of its own, nothing applied: the kernel tests call its functions directly."""
    return load_module(PATCHES_DIR / name / "patch.py", f"invar_test_patch_{name.replace('-', '_')}")


def patch_args(name: str, *, poison: bool = False) -> list[str]:
    """`--patch NAME=<its digest>` (and the poison switch) for a worker's command line."""
    return ["--patch", f"{name}={patch_digest(name)}", *(["--patch-poison", name] if poison else [])]


def run(worker: WorkerClient, requests: list[dict[str, Any]], layout: list[list[int]]) -> dict[str, Any]:
    result: dict[str, Any] = worker.call("generate", {"requests": requests, "layout": layout, "adapter": None,
                                                      "reference_adapter": None})
    return result


def layouts(n: int) -> dict[str, list[list[int]]]:
    """One batch, two batches of half, the rows shuffled into two batches, and every request alone."""
    order = list(range(n))
    random.Random(7).shuffle(order)
    return {"one batch": [list(range(n))], "two halves": [list(range(n // 2)), list(range(n // 2, n))],
            "shuffled halves": [order[: n // 2], order[n // 2:]], "one by one": [[i] for i in range(n)]}


def bit_equal_share(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[float, int]:
    """Share of log-probabilities bit-equal between two runs over the requests whose tokens agree, and how many
    requests have different tokens."""
    equal = total = differ = 0
    for x, y in zip(a, b, strict=True):
        if not np.array_equal(x["tokens"], y["tokens"]):
            differ += 1
            continue
        equal += int(np.sum(x["logprobs"].view(np.int32) == y["logprobs"].view(np.int32)))
        total += x["logprobs"].size
    return equal / max(total, 1), differ


def same_token_diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    pairs = [(x["logprobs"], y["logprobs"]) for x, y in zip(a, b, strict=True)
             if np.array_equal(x["tokens"], y["tokens"])]
    return max_abs_diff([p for p, _ in pairs], [q for _, q in pairs])
