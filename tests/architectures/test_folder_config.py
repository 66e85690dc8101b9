"""config.json read the transformers way, without an engine: defaults per model_type, and a key the file names
overriding its default even when null."""

from __future__ import annotations

from invar.formats.model_config import differences, folder_config

GEMMA2 = {"model_type": "gemma2", "vocab_size": 18, "hidden_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 2, "head_dim": 32, "sliding_window": 8,
          "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 32}


def test_gemma2_soft_capping_defaults_to_transformers_values_and_null_means_none() -> None:
    absent = folder_config(GEMMA2)
    assert (absent["attn_softcap"], absent["final_softcap"]) == (50.0, 30.0)  # Gemma2Config's defaults
    off = folder_config({**GEMMA2, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (off["attn_softcap"], off["final_softcap"]) == (None, None)
    assert absent["sliding_window"] == [8, None]
    assert absent["embed_scale"] == 9.797959327697754  # √96 in float32
    assert absent["tied_embeddings"] is True


def test_per_layer_type_rope_and_partial_rotary() -> None:
    gemma3 = {**GEMMA2, "model_type": "gemma3_text", "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 250_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20_000.0}}}
    assert folder_config(gemma3)["rope_theta"] == [20_000.0, 250_000.0]
    assert folder_config({**gemma3, "rope_parameters": None})["rope_theta"] == [10_000.0, 1_000_000.0]
    phi3 = {"model_type": "phi3", "vocab_size": 18, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "rope_parameters": {"rope_theta": 10_000.0, "partial_rotary_factor": 0.5}}
    assert folder_config(phi3)["rope_dims"] == [16, 16]
    assert folder_config(phi3)["norm_eps"] == 1e-5


def test_differences_name_the_field_and_both_values() -> None:
    want = folder_config(GEMMA2)
    got = {**want, "sliding_window": [None, None], "rope_theta": [10_000.4, 10_000.4]}  # θ within its margin
    assert differences(want, got) == [
        "sliding_window: the folder's config.json gives [8, null], the engine computes with [null, null]"]
    assert differences(want, {"vocab_size": 18}) == []  # a field the engine does not report is not compared
