"""Each engine's effective configuration, read back from the model it built (`invar.formats.model_config.FIELDS`).

A worker calls its engine's reader at `load_model` and returns the map as `effective_config`; the core compares it
with the folder's `config.json` (`invar.formats.model_config.differences`). The readers look at the built modules,
not at config.json: the rotary embedding's inverse frequencies or base, each layer's window, the attention module's
scale and soft-capping, the norm's ε, whether the output layer is the embedding. Where an engine applies a setting
in code that keeps no attribute (mlx-lm's embedding scale), the reader states what that code computes for the
installed version. A field a reader cannot find is left out, never guessed.

Duck-typed on the engine's objects: this module imports no engine, so each worker imports it alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def theta_from_inv_freq(inv_freq: list[float]) -> tuple[float, int]:
    """(θ, rotated dimensions) of inverse frequencies θ^(-2i/d) (i = 0 … d/2-1), computed in float64.

    The ratio of the first two frequencies is θ^(2/d) whatever uniform factor (linear scaling) divides them all.
    """
    dims = 2 * len(inv_freq)
    if len(inv_freq) < 2 or inv_freq[1] <= 0:
        return float("nan"), dims
    return float((float(inv_freq[0]) / float(inv_freq[1])) ** (dims / 2)), dims


def bfloat16(value: float) -> float:
    """`value` rounded to bfloat16 (nearest, ties to even), as a float."""
    bits = np.array([value], dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return float(rounded.view(np.float32)[0])


def hf_effective(model: Any) -> dict[str, Any]:
    """A transformers causal LM's effective configuration (float32 values as the modules hold them)."""
    cfg = model.config
    inner = model.model
    layers = list(inner.layers)
    rotary = getattr(inner, "rotary_emb", None)
    config_types = getattr(cfg, "layer_types", None)
    out: dict[str, Any] = {"vocab_size": int(model.get_output_embeddings().weight.shape[0]), "layers": len(layers)}
    theta, dims, window = [], [], []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        layer_type = getattr(attn, "layer_type", None) or (config_types[i] if config_types else None)
        inv = getattr(rotary, f"{layer_type}_inv_freq", None) if layer_type else None
        if inv is None and rotary is not None:
            inv = getattr(rotary, "inv_freq", None)
        if inv is not None:
            t, d = theta_from_inv_freq([float(x) for x in inv.float().tolist()])
            theta.append(t)
            dims.append(d)
        w = getattr(attn, "sliding_window", None)
        if w is None and not config_types and getattr(cfg, "sliding_window", None) is not None \
                and getattr(cfg, "use_sliding_window", True):
            w = cfg.sliding_window  # models without layer types (Mistral) mask every layer by the config's window
        window.append(None if w is None else int(w))
    if len(theta) == len(layers):
        out["rope_theta"], out["rope_dims"] = theta, dims
    out["sliding_window"] = window
    attn0 = layers[0].self_attn
    if getattr(attn0, "scaling", None) is not None:
        out["attention_scale"] = float(np.float32(attn0.scaling))
    out["attn_softcap"] = _opt(getattr(attn0, "attn_logit_softcapping", None))
    # transformers' attention computes softcap · torch.tanh(x / softcap) (Gemma 2 runs eager attention for it)
    out["attn_softcap_tanh"] = None if out["attn_softcap"] is None else "tanh"
    out["final_softcap"] = _opt(getattr(cfg, "final_logit_softcapping", None))  # read there at every forward
    scale = getattr(inner.embed_tokens, "embed_scale", None)
    out["embed_scale"] = None if scale is None else float(scale.to(inner.embed_tokens.weight.dtype))
    out["tied_embeddings"] = bool(
        model.get_output_embeddings().weight.data_ptr() == inner.embed_tokens.weight.data_ptr())
    eps = getattr(inner.norm, "eps", None)
    eps = getattr(inner.norm, "variance_epsilon", None) if eps is None else eps
    if eps is not None:
        out["norm_eps"] = float(eps)
    return out


MLX_EMBED_SCALE = {"gemma": "float32", "gemma2": "float32", "gemma3_text": "bfloat16"}
"""How mlx-lm 0.32 scales the input embedding by √hidden, by model module: in float32 (`h * hidden**0.5`), or
rounded to bfloat16 first (`mx.array(hidden**0.5, mx.bfloat16)`, 25.25 for √640 = 25.2982) whatever the model's
dtype. The code keeps no attribute to read back, so the reader states it."""


def mlx_effective(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """An mlx-lm model's effective configuration, from its modules (and `MLX_EMBED_SCALE`)."""
    inner = model.model
    layers = list(model.layers)
    out: dict[str, Any] = {"vocab_size": int(inner.embed_tokens.weight.shape[0]), "layers": len(layers)}
    theta, dims, window = [], [], []
    model_window = getattr(inner, "sliding_window", None) or getattr(inner, "window_size", None)
    for layer in layers:
        attn = layer.self_attn
        rope = getattr(attn, "rope", None)
        base, rotated = getattr(rope, "base", None), getattr(rope, "dims", None)
        if isinstance(base, int | float) and isinstance(rotated, int):
            theta.append(float(base))
            dims.append(rotated)
        sliding = getattr(layer, "use_sliding", None)
        if sliding is None:
            sliding = getattr(attn, "is_sliding", False)
        window.append(int(model_window) if sliding and model_window is not None else None)
    if len(theta) == len(layers):
        out["rope_theta"], out["rope_dims"] = theta, dims
    out["sliding_window"] = window
    attn0 = layers[0].self_attn
    if getattr(attn0, "scale", None) is not None:
        out["attention_scale"] = float(np.float32(attn0.scale))
    out["attn_softcap"] = _opt(getattr(attn0, "attn_logit_softcapping", None))
    out["attn_softcap_tanh"] = None if out["attn_softcap"] is None else "tanh"  # mlx-lm: mx.tanh(x / cap) * cap
    out["final_softcap"] = _opt(getattr(model, "final_logit_softcapping", None))
    kind = MLX_EMBED_SCALE.get(str(config.get("model_type")))
    root = math.sqrt(float(config["hidden_size"]))
    out["embed_scale"] = None if kind is None else bfloat16(root) if kind == "bfloat16" else float(np.float32(root))
    out["tied_embeddings"] = "lm_head" not in model
    eps = getattr(inner.norm, "eps", None)
    if eps is not None:
        out["norm_eps"] = float(eps)
    return out


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


VLLM_CPU_FAST_EXP = "fast_exp"
"""What vLLM's CPU attention kernel computes for the soft-cap's tanh where its library is built for AVX-512 (x86
with AVX-512: `_C` or `_C_AVX512`): (e − 1/e) / (e + 1/e) of e = `fast_exp(x / softcap)`, a polynomial approximation
of exp (`DEFINE_FAST_EXP`, csrc/cpu/cpu_attn_impl.hpp `apply_softcap`), times softcap; the AVX2 build and other
architectures without that macro call std::tanh."""


def vllm_softcap_tanh(impl: Any) -> str | None:
    """How the attention backend `impl` computes the soft-cap's tanh: `"tanh"`, `VLLM_CPU_FAST_EXP`, or None where
    the backend is not one whose kernel this reader knows (vLLM 0.32's CPU attention)."""
    if type(impl).__name__ != "CPUAttentionBackendImpl":
        return None
    import platform

    import torch  # the engine's own torch: this runs inside vLLM's process

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return VLLM_CPU_FAST_EXP if x86 and torch.cpu._is_avx512_supported() else "tanh"


def vllm_effective(model: Any) -> dict[str, Any]:
    """A vLLM model's effective configuration, from its modules (run inside the engine through `apply_model`).

    Each layer's rotary embedding (`base`, `rotary_dim`), its attention layer (`sliding_window`) and the attention
    backend's `scale` and `logits_soft_cap` (with how its kernel computes the soft-cap, `vllm_softcap_tanh`); the
    embedding's `normalizer` (Gemma), the logits processor's
    `soft_cap`, whether `lm_head` is the embedding, the final norm's ε.
    """
    inner = model.model
    layers = list(inner.layers)
    embed = inner.embed_tokens
    out: dict[str, Any] = {"layers": len(layers)}
    head = getattr(model, "lm_head", None)
    vocab = getattr(model, "unpadded_vocab_size", None) or getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None:
        out["vocab_size"] = int(vocab)
    theta, dims, window = [], [], []
    scale = soft = impl0 = None
    for layer in layers:
        attn = layer.self_attn
        rope = getattr(attn, "rotary_emb", None)
        base, rotated = getattr(rope, "base", None), getattr(rope, "rotary_dim", None)
        if isinstance(base, int | float) and isinstance(rotated, int):
            theta.append(float(base))
            dims.append(rotated)
        core = getattr(attn, "attn", None)
        w = getattr(core, "sliding_window", None)
        window.append(None if w is None else int(w))
        impl = getattr(core, "impl", None)
        impl_scale = getattr(impl, "scale", None)
        if scale is None and impl_scale is not None:
            scale, soft, impl0 = float(np.float32(impl_scale)), getattr(impl, "logits_soft_cap", None), impl
    if len(theta) == len(layers):
        out["rope_theta"], out["rope_dims"] = theta, dims
    out["sliding_window"] = window
    if scale is not None:
        out["attention_scale"] = scale
        out["attn_softcap"] = None if not soft else float(soft)
        kernel = vllm_softcap_tanh(impl0) if soft else None
        if not soft or kernel is not None:  # a backend whose kernel is not known here: left out, not guessed
            out["attn_softcap_tanh"] = kernel
    processor = getattr(model, "logits_processor", None)
    if processor is not None:
        cap = getattr(processor, "soft_cap", None)
        out["final_softcap"] = None if cap is None else float(cap)
    normalizer = getattr(inner, "normalizer", None)
    out["embed_scale"] = None if normalizer is None else float(normalizer.to(embed.weight.dtype))
    if head is not None:
        out["tied_embeddings"] = bool(head is embed or getattr(head, "weight", None) is embed.weight)
    eps = getattr(inner.norm, "variance_epsilon", None)
    if eps is not None:
        out["norm_eps"] = float(eps)
    return out
