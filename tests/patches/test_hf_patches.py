"""Patched Hugging Face workers on the shipped model: fixed-block makes the engine batch invariant, split-k does not,
the patch proves it ran, and a poisoned or misnamed patch cannot pass for the real one.

Measured results are printed (lines starting `measured:`; run with -s) and bounded by the asserts; the patches'
READMEs list them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hf_calls import bit_identical, make_requests, score
from patch_helpers import bit_equal_share, layouts, run, same_token_diff

from invar.patches import patch_digest
from invar.tasks import Problem
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

N = 32


@pytest.fixture(scope="module")
def requests(problems: list[Problem]) -> list[dict[str, Any]]:
    """The first 32 evaluation prompts at temperature 1, each with its own seed."""
    return make_requests(problems[:N], seed=1000, temperature=1.0)


@pytest.fixture(scope="module")
def stock_runs(hf_stock: WorkerClient, requests: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {name: run(hf_stock, requests, layout)["outputs"] for name, layout in layouts(N).items()}


def test_patched_identity_names_the_patch_and_eager_attention(hf_fixed_block: WorkerClient,
                                                              hf_stock: WorkerClient) -> None:
    settings = hf_fixed_block.identity.settings
    assert settings["patches"] == {"fixed-block": patch_digest("fixed-block")}
    assert settings["attn_implementation"] == "eager"
    assert "patch_poison" not in settings
    stock = hf_stock.identity.settings
    assert "patches" not in stock
    assert "patch_poison" not in stock
    assert stock["attn_implementation"] == "sdpa"
    assert {k: v for k, v in settings.items() if k not in ("patches", "attn_implementation")} == {
        k: v for k, v in stock.items() if k != "attn_implementation"}


def test_fixed_block_is_bit_identical_across_batch_layouts(hf_fixed_block: WorkerClient,
                                                           requests: list[dict[str, Any]],
                                                           stock_runs: dict[str, list[dict[str, Any]]]) -> None:
    runs = {}
    for name, layout in layouts(N).items():
        result = run(hf_fixed_block, requests, layout)
        assert result["patch_calls"]["fixed-block"] > 0, f"{name}: the patch replaced no op"
        runs[name] = result["outputs"]
    reference = runs["one batch"]
    for name, outputs in runs.items():
        assert bit_identical([o["tokens"] for o in outputs], [o["tokens"] for o in reference]), name
        assert bit_identical([o["logprobs"] for o in outputs], [o["logprobs"] for o in reference]), name
    stock_share, stock_differ = bit_equal_share(stock_runs["one batch"], stock_runs["one by one"])
    print(f"measured: hf stock, one batch of {N} vs one by one: {100 * stock_share:.1f} % of log-probs bit-equal, "
          f"{stock_differ} requests with other tokens, max |diff| "
          f"{same_token_diff(stock_runs['one batch'], stock_runs['one by one']):.3g}; fixed-block: 100 % in every "
          f"layout ({', '.join(runs)})")


def test_fixed_block_stays_close_to_stock(hf_fixed_block: WorkerClient, requests: list[dict[str, Any]],
                                          stock_runs: dict[str, list[dict[str, Any]]]) -> None:
    patched = run(hf_fixed_block, requests, layouts(N)["one batch"])["outputs"]
    stock = stock_runs["one batch"]
    same = sum(np.array_equal(p["tokens"], s["tokens"]) for p, s in zip(patched, stock, strict=True))
    diff = same_token_diff(patched, stock)
    share, _ = bit_equal_share(patched, stock)
    print(f"measured: hf fixed-block vs stock, one batch of {N}: tokens equal on {same}/{N}, max |diff| {diff:.3g} "
          f"nats, {100 * share:.1f} % bit-equal")
    assert same >= N - 2, "a change of rounding should flip a sampled token only rarely"
    assert diff <= 1e-4


def test_fixed_block_score_reports_patch_calls_and_is_batch_invariant(hf_fixed_block: WorkerClient,
                                                                      requests: list[dict[str, Any]]) -> None:
    outputs = run(hf_fixed_block, requests, layouts(N)["one batch"])["outputs"]
    items = [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"], "temperature": 1.0, "vocab_steps": []}
             for r, o in zip(requests, outputs, strict=True)]
    together = hf_fixed_block.call("score", {"items": items, "adapter": None})
    assert together["patch_calls"]["fixed-block"] > 0
    assert bit_identical([s["logprobs"] for s in together["outputs"]], [o["logprobs"] for o in outputs])
    for i in (0, 13, 31):
        alone = hf_fixed_block.call("score", {"items": [items[i]], "adapter": None})
        assert alone["patch_calls"]["fixed-block"] > 0
        assert bit_identical([alone["outputs"][0]["logprobs"]], [together["outputs"][i]["logprobs"]])


def test_fixed_block_over_nf4_weights_is_bit_identical_across_batch_layouts(
        hf_fixed_block_nf4: WorkerClient, requests: list[dict[str, Any]]) -> None:
    n = 16
    batch = run(hf_fixed_block_nf4, requests[:n], layouts(n)["one batch"])
    alone = run(hf_fixed_block_nf4, requests[:n], layouts(n)["one by one"])
    assert batch["patch_calls"]["fixed-block"] > 0
    assert bit_identical([o["tokens"] for o in alone["outputs"]], [o["tokens"] for o in batch["outputs"]])
    assert bit_identical([o["logprobs"] for o in alone["outputs"]], [o["logprobs"] for o in batch["outputs"]])


def test_split_k_changes_bits_between_layouts(hf_split_k: WorkerClient, requests: list[dict[str, Any]]) -> None:
    batch = run(hf_split_k, requests, layouts(N)["one batch"])
    alone = run(hf_split_k, requests, layouts(N)["one by one"])
    assert batch["patch_calls"]["split-k"] > 0
    assert alone["patch_calls"]["split-k"] > 0
    assert hf_split_k.identity.settings["patches"] == {"split-k": patch_digest("split-k")}
    share, differ = bit_equal_share(batch["outputs"], alone["outputs"])
    diff = same_token_diff(batch["outputs"], alone["outputs"])
    print(f"measured: hf split-k, one batch of {N} vs one by one: {100 * share:.1f} % of log-probs bit-equal, "
          f"{differ} requests with other tokens, max |diff| {diff:.3g}")
    assert share < 1.0, "split-k must be batch variant: the row count picks the K split"
    assert differ <= 2, "rounding differences rarely flip a sampled token"
    assert diff <= 1e-4, "and the log-probabilities stay within float rounding of each other"
    # The same layout twice is still deterministic.
    again = run(hf_split_k, requests, layouts(N)["one batch"])
    assert bit_identical([o["logprobs"] for o in again["outputs"]], [o["logprobs"] for o in batch["outputs"]])


def test_poison_changes_the_bits_and_is_in_the_identity(hf_fixed_block_poisoned: WorkerClient,
                                                        hf_fixed_block: WorkerClient,
                                                        requests: list[dict[str, Any]]) -> None:
    settings = hf_fixed_block_poisoned.identity.settings
    assert settings["patch_poison"] == ["fixed-block"]
    assert settings["patches"] == hf_fixed_block.identity.settings["patches"]
    assert hf_fixed_block_poisoned.identity.digest != hf_fixed_block.identity.digest
    layout = layouts(8)["one batch"]
    poisoned = run(hf_fixed_block_poisoned, requests[:8], layout)
    clean = run(hf_fixed_block, requests[:8], layout)
    assert poisoned["patch_calls"]["fixed-block"] > 0
    assert not bit_identical([o["logprobs"] for o in poisoned["outputs"]], [o["logprobs"] for o in clean["outputs"]])
    scored = score(hf_fixed_block_poisoned, requests[:8], clean["outputs"], temperature=1.0)
    assert not bit_identical([s["logprobs"] for s in scored], [o["logprobs"] for o in clean["outputs"]])

