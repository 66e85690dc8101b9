"""`invar train` on the vllm+hf backend (vLLM generates and scores the reference, Hugging Face learns through peft),
on the shipped model: a short run with a KL term, whose objective the core recomputes and whose checkpoint chain
verifies; the history measures the learner–engine gap of two different implementations every cycle.

vLLM takes 20 s to 75 s to start here, so this module is slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import check_finished, invar, published, write_config

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("vllm-hf")
    config = write_config(folder, "vllm-hf-small", "vllm+hf", cycles=2)
    run = folder / "run"
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    return run, json.loads(out.stdout)["chain_head"]


def test_a_short_run_publishes_a_verified_chain(finished: tuple[Path, str]) -> None:
    run, head = finished
    h = check_finished(run, head, 2, kl_coef=0.05)
    first = h.cycles[0]
    # vLLM and HF agree on the tokens to float32 rounding (docs/cross_engine.md): a gap, but a small one.
    assert first.gap.max < 1e-3
    assert h.cycles[1].kl_core > 0  # the engine scored the reference (the base model) in the same rollout


def test_two_vllm_workers_publish_the_policies_of_one(finished: tuple[Path, str], tmp_path: Path) -> None:
    """A cycle's prompt groups split over two vLLM engines (rollout.workers = 2): vLLM is batch-invariant on the
    CPU, so the rollouts, and so every published checkpoint, are those of one engine, bit for bit."""
    config = write_config(tmp_path, "vllm-hf-small", "vllm+hf", cycles=2, rollout={"workers": 2})
    run = tmp_path / "run"
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    compared = invar("compare", "histories", finished[0], run, "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert published(run) == published(finished[0])
