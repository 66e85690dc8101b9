"""Patched vLLM (CPU) workers on the shipped model: the patch runs where the model runs (the engine core in the
worker's own process), fixed-block stays bit-identical across batch layouts, split-k does not.

Measured results are printed (lines starting `measured:`; run with -s); the patches' READMEs list them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hf_calls import bit_identical, make_requests
from patch_helpers import bit_equal_share, layouts, run, same_token_diff

from invar.patches import patch_digest
from invar.tasks import Problem
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

N = 32


@pytest.fixture(scope="module")
def requests(problems: list[Problem]) -> list[dict[str, Any]]:
    return make_requests(problems[:N], seed=2000, temperature=1.0)


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def test_the_engine_core_runs_in_the_worker_process(vllm_fixed_block: WorkerClient,
                                                     requests: list[dict[str, Any]]) -> None:
    """A patch replaces Python code in the process that imports it: the worker keeps vLLM's engine core in-process
    (and says so in its identity), and the replaced ops are counted there on every call."""
    settings = vllm_fixed_block.identity.settings
    assert settings["patches"] == {"fixed-block": patch_digest("fixed-block")}
    assert settings["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    result = run(vllm_fixed_block, requests[:4], [[0, 1, 2, 3]])
    assert result["patch_calls"]["fixed-block"] > 0
    assert _children(vllm_fixed_block.identity.pid) == [], "no engine-core process beside the worker"


def test_fixed_block_is_bit_identical_across_batch_layouts(vllm_fixed_block: WorkerClient,
                                                           requests: list[dict[str, Any]]) -> None:
    runs = {}
    for name, layout in layouts(N).items():
        result = run(vllm_fixed_block, requests, layout)
        assert result["patch_calls"]["fixed-block"] > 0, f"{name}: the patch replaced no op"
        runs[name] = result["outputs"]
    reference = runs["one batch"]
    for name, outputs in runs.items():
        assert bit_identical([o["tokens"] for o in outputs], [o["tokens"] for o in reference]), name
        assert bit_identical([o["logprobs"] for o in outputs], [o["logprobs"] for o in reference]), name
    print(f"measured: vllm fixed-block: 100 % of log-probs bit-equal in every layout ({', '.join(runs)}), "
          f"{sum(o['tokens'].size for o in reference)} tokens")


def test_fixed_block_score_reports_patch_calls(vllm_fixed_block: WorkerClient,
                                               requests: list[dict[str, Any]]) -> None:
    outputs = run(vllm_fixed_block, requests[:8], [list(range(8))])["outputs"]
    items = [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"], "temperature": 1.0, "vocab_steps": []}
             for r, o in zip(requests[:8], outputs, strict=True)]
    scored = vllm_fixed_block.call("score", {"items": items, "adapter": None})
    assert scored["patch_calls"]["fixed-block"] > 0
    # vLLM's prompt log-probabilities and its sampler's are the same float32 log_softmax, here the patched one.
    assert bit_identical([s["logprobs"] for s in scored["outputs"]], [o["logprobs"] for o in outputs])


def test_split_k_changes_bits_between_layouts(vllm_split_k: WorkerClient, requests: list[dict[str, Any]]) -> None:
    n = 16
    batch = run(vllm_split_k, requests[:n], layouts(n)["one batch"])
    alone = run(vllm_split_k, requests[:n], layouts(n)["one by one"])
    assert batch["patch_calls"]["split-k"] > 0
    assert alone["patch_calls"]["split-k"] > 0
    assert vllm_split_k.identity.settings["patches"] == {"split-k": patch_digest("split-k")}
    share, differ = bit_equal_share(batch["outputs"], alone["outputs"])
    diff = same_token_diff(batch["outputs"], alone["outputs"])
    print(f"measured: vllm split-k, one batch of {n} vs one by one: {100 * share:.1f} % of log-probs bit-equal, "
          f"{differ} requests with other tokens, max |diff| {diff:.3g}")
    assert share < 1.0, "split-k must be batch variant: the row count picks the K split"
    assert differ <= 2
    assert diff <= 1e-4
    assert np.isfinite(diff)
