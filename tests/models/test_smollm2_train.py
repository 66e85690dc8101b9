"""`invar train` on the real instruct model (vllm+hf, LoRA through peft), small: two cycles of 2 chat prompts × 2
samples from the chat task's training split, scored by the `numeric` scorer, with a KL term so vLLM also scores the
reference (the base model) in each rollout.

What it shows on a 49,152-token BPE model with a chat template, where the shipped model has 18 characters:
`inspect history` re-derives every cycle's requests from the population and the seed (the chat template's ids,
rendered by the core) and re-scores every response; the core's objective equals the learner's; the checkpoint chain
verifies; and vLLM's and HF's log-probabilities of the sampled tokens differ only by float rounding. The long run,
its accuracy gain and gap table are in docs/training.md ("The real model").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli_runs import invar

from invar import canonical
from invar.records import RunStore

pytestmark = [pytest.mark.engine, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAT_TRAIN = REPO_ROOT / "data" / "chat-train.jsonl"


@pytest.fixture(scope="module")
def trained(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("smollm2-train")
    config = folder / "smollm2-small.toml"
    config.write_text("\n".join([
        'name = "smollm2-small"', 'backend = "vllm+hf"', f'model = "{smollm2_dir}"', "seed = 3", "cycles = 2",
        "[prompts]", f'path = "{CHAT_TRAIN}"', "per_cycle = 2",
        "[rollout]", "group_size = 2", "temperature = 1.0", "max_tokens = 8",
        "[optimizer]", "lr = 0.02",
        "[objective]", "kl_coef = 0.05",
        "[scorer]", 'name = "numeric"', 'settings = { which = "last" }',
    ]) + "\n", encoding="utf-8")
    run = folder / "run"
    done = invar("train", config, "--run", run, "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return run, json.loads(done.stdout)


def test_a_short_run_on_the_real_model_verifies_from_its_records(trained: tuple[Path, dict[str, Any]]) -> None:
    run, result = trained
    with RunStore.open(run) as store:
        assert store.verify(expect_head=result["chain_head"]).closed
    shown = invar("inspect", "history", run, "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    history = json.loads(shown.stdout)
    cycles = history["cycles"]
    assert [c["cycle"] for c in cycles] == [0, 1]
    assert [c["policy"] for c in cycles] == [None, cycles[0]["checkpoint"]]
    for c in cycles:
        assert canonical.tree_digest(run / "checkpoints" / f"cycle-{c['cycle']:06d}") == c["checkpoint"]
        assert c["samples"] == 4
        assert c["staleness"] == 0
        gap = c["gap"]
        print(f"measured: smollm2 vllm+hf cycle {c['cycle']}: {gap['equal']}/{gap['tokens']} tokens equal, "
              f"max {gap['max']:.3g} nats; loss |Δ| {c['loss_abs_diff']:.3g}; wall {c['wall_s']}")
        # Two implementations of the same float32 model: the gap is rounding, far below a sampled token's
        # log-probability, and w = exp(proximal − behavior) is exactly 1 where the two agree to the bit.
        assert 0 < gap["tokens"] <= 4 * 8
        assert gap["max"] < 1e-3
        assert c["importance"]["exactly_one"] == gap["equal"]
        bound = 1e-6 * (2.0 * max(abs(c["advantage_min"]), abs(c["advantage_max"])) + 0.05)
        assert c["loss_abs_diff"] <= bound
    # vLLM scored the reference in each rollout and the core recomputed the KL term. At cycle 0 the policy is the
    # base model, so only rounding separates the sampled tokens' decode-time log-probabilities from the reference's
    # teacher-forced ones (k3 of order 1e-11). That rounding still gives the KL term a gradient, and AdamW's first
    # step moves each adapter weight with a non-zero gradient by about lr whatever the gradient's size, so after one
    # update (lr 0.02) the policy has moved off the reference even when no group's rewards differed.
    kl0, kl1 = cycles[0]["kl_core"], cycles[1]["kl_core"]
    print(f"measured: k3 KL cycle 0 {kl0:.3g}, cycle 1 {kl1:.3g}; cycle 0 groups with a reward gradient: "
          f"{cycles[0]['groups'] - cycles[0]['zero_variance_groups']}")
    assert 0.0 <= kl0 < 1e-9
    assert kl1 > 1e-5
