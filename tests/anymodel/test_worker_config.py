"""What the workers read from a model folder that is not the shipped one, without starting an engine.

The end ids every worker stops at are the core's (`response_end_ids`), and the MLX worker builds the rotary
embedding with the θ that transformers 5 writes under `rope_parameters` only (mlx-lm 0.32's Llama reads the
top-level `rope_theta` and silently takes 10,000 without it). Marked `engine`: the folder is built with torch and
transformers, and the MLX check loads mlx-lm, all of them engine dependencies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROPE_THETA

from invar.engines import DEFAULT_MODEL
from invar.tasks import ModelTokenizer
from invar.workers.common import response_end_ids

pytestmark = pytest.mark.engine


def test_the_end_ids_are_the_core_s_generation_config_first(any_model: Path) -> None:
    assert response_end_ids(str(any_model)) == {0, 2}  # config.json names 2 only
    assert response_end_ids(str(any_model)) == set(ModelTokenizer.from_model_dir(any_model).eos_token_ids)
    assert response_end_ids(str(DEFAULT_MODEL)) == {2}


def test_mlx_builds_the_rope_the_folder_names(any_model: Path) -> None:
    from mlx_lm.utils import load_model

    from invar.workers.mlx_worker import rope_overrides

    assert rope_overrides(any_model) == {"rope_theta": ROPE_THETA}
    model, config = load_model(any_model, model_config=rope_overrides(any_model))
    assert config["rope_theta"] == ROPE_THETA
    assert model.layers[0].self_attn.rope.base == ROPE_THETA
    unmapped, _ = load_model(any_model)
    assert unmapped.layers[0].self_attn.rope.base == 10_000  # what mlx-lm alone builds: the reason for the mapping
    # the shipped Qwen3 already had its θ (mlx-lm's Qwen3 reads rope_parameters): the same value, passed explicitly
    assert rope_overrides(DEFAULT_MODEL) == {"rope_theta": 10_000.0}
