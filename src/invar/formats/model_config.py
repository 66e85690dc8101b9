"""The effective configuration of a decoder model: what an engine computes with, in one canonical form.

A worker reports, at `load_model`, the configuration it read back from the model it built (`effective_config` in
the result: a map of the `FIELDS` below). The core reads the folder's `config.json` the transformers way, defaults
per `model_type` included (`folder_config`), and compares the two field by field (`differences`): a field the
engine does not honour is one line naming the field, the folder's value and the engine's.

Per-layer fields are lists with one entry per decoder layer. Floats are compared relatively (`RELATIVE`); θ is
recovered from float32 inverse frequencies by the workers, so it gets a wider margin (`THETA_RELATIVE`). A field
a worker leaves out is not compared: a worker reports what it can read back from its engine.

Pure functions, no engine imports: the core recomputes what the folder asks for from the JSON alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from invar.errors import InvarError

FIELDS: dict[str, str] = {
    "vocab_size": "rows of the output layer",
    "layers": "decoder layers",
    "rope_theta": "per layer: the rotary base θ the layer's rotary embedding uses",
    "rope_dims": "per layer: how many dimensions of each head are rotated (partial rotary: fewer than head_dim)",
    "sliding_window": "per layer: the attention window (null: the layer attends to the whole prefix)",
    "attention_scale": "the factor on q·k before the softmax",
    "attn_softcap": "attention-logit soft-capping (null: none)",
    "attn_softcap_tanh": "how the attention kernel computes the soft-cap's tanh: \"tanh\" (softcap · tanh(x / softcap) "
                         "as transformers computes it) or the engine's approximation by name (null: no soft-capping)",
    "final_softcap": "final-logit soft-capping (null: none)",
    "embed_scale": "the factor on the input embedding, as the float32 value applied (null: none)",
    "tied_embeddings": "whether the output layer is the input embedding",
    "norm_eps": "ε of the RMS norms",
}
"""The canonical fields and what each means."""

RELATIVE = 1e-6
THETA_RELATIVE = 1e-4

_GEMMA = ("gemma", "gemma2", "gemma3_text", "gemma3")
_DEFAULTS: dict[str, dict[str, Any]] = {
    # transformers' config defaults for the keys read here, where a folder may leave them out
    "llama": {"rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "mistral": {"rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "qwen2": {"rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "qwen3": {"rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "phi3": {"rms_norm_eps": 1e-5, "tie_word_embeddings": False},
    "gemma2": {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256},
    "gemma3_text": {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "query_pre_attn_scalar": 256,
                    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}},
}


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's `config.json` as a map (a multimodal Gemma 3's `text_config` is the decoder's)."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{Path(folder) / 'config.json'}: not a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict) and config.get("model_type") == "gemma3":
        return {"model_type": "gemma3_text", **text}
    return config


def _rope_for(config: Mapping[str, Any], layer_type: str) -> Mapping[str, Any]:
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get(layer_type), dict):
        return rope[layer_type]  # type: ignore[no-any-return]  # per layer type, as transformers 5 writes it
    if isinstance(rope, dict) and "rope_theta" in rope:
        return rope
    theta = config.get("rope_theta") or 10_000.0
    return {"rope_type": "default", "rope_theta": theta, **(config.get("rope_scaling") or {})}


def folder_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What transformers computes for this `config.json`, in the canonical fields (defaults per model_type)."""
    model_type = str(config.get("model_type", ""))
    # a key the file names overrides the default even when null (null soft-capping is none, as transformers reads it)
    c: dict[str, Any] = {**_DEFAULTS.get(model_type, {}), **config}
    if model_type in _DEFAULTS and "rope_parameters" in _DEFAULTS[model_type] and \
            not isinstance(config.get("rope_parameters"), dict):
        c["rope_parameters"] = _DEFAULTS[model_type]["rope_parameters"]
    layers = int(c["num_hidden_layers"])
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
    layer_types = c.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        sliding = (c.get("sliding_window") is not None and model_type in ("mistral",)) or (
            model_type in ("qwen2", "qwen3") and c.get("use_sliding_window") and c.get("sliding_window"))
        layer_types = ["sliding_attention" if sliding else "full_attention"] * layers
    theta, dims = [], []
    for layer_type in layer_types:
        rope = _rope_for(c, layer_type)
        theta.append(float(rope.get("rope_theta") or 10_000.0))
        factor = rope.get("partial_rotary_factor") or c.get("partial_rotary_factor") or 1.0
        dims.append(int(head_dim * float(factor)))
    window = c.get("sliding_window")
    out: dict[str, Any] = {
        "vocab_size": int(c["vocab_size"]),
        "layers": layers,
        "rope_theta": theta,
        "rope_dims": dims,
        "sliding_window": [int(window) if t == "sliding_attention" and window is not None else None
                           for t in layer_types],
        "attention_scale": float(np.float32(float(c["query_pre_attn_scalar"]) ** -0.5))
        if model_type in _GEMMA and c.get("query_pre_attn_scalar") is not None
        else float(np.float32(head_dim ** -0.5)),
        "attn_softcap": _float_or_none(c.get("attn_logit_softcapping")),
        "attn_softcap_tanh": None if c.get("attn_logit_softcapping") is None else "tanh",
        "final_softcap": _float_or_none(c.get("final_logit_softcapping")),
        "embed_scale": float(np.float32(math.sqrt(float(c["hidden_size"])))) if model_type in _GEMMA else None,
        "tied_embeddings": bool(c.get("tie_word_embeddings")),
        "norm_eps": float(c.get("rms_norm_eps") or 1e-6),
    }
    return out


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def same_value(field: str, want: Any, got: Any) -> bool:
    """Whether two values of `field` are the same (floats relatively, θ within `THETA_RELATIVE`, per layer)."""
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(same_value(field, w, g) for w, g in zip(want, got, strict=True))
    if isinstance(want, bool) or isinstance(got, bool) or want is None or got is None:
        return bool(want == got)
    if isinstance(want, int | float) and isinstance(got, int | float):
        tol = THETA_RELATIVE if field == "rope_theta" else RELATIVE
        return math.isclose(float(want), float(got), rel_tol=tol, abs_tol=0.0)
    return bool(want == got)


def differences(folder: Mapping[str, Any], engine: Mapping[str, Any]) -> list[str]:
    """One line per canonical field the engine reports with another value than the folder's."""
    out = []
    for field in FIELDS:
        if field not in engine or field not in folder:
            continue
        if not same_value(field, folder[field], engine[field]):
            out.append(f"{field}: the folder's config.json gives {show_value(folder[field])}, the engine computes "
                       f"with {show_value(engine[field])}")
    return out


def show_value(value: Any) -> str:
    """A field's value as the one-line messages show it (a per-layer list the same on every layer, once)."""
    if isinstance(value, float):
        return f"{value:.7g}"
    if isinstance(value, list) and len(value) > 2 and all(v == value[0] for v in value):
        return f"[{show_value(value[0])} × {len(value)} layers]"  # one value per layer, the same on every layer
    if isinstance(value, list):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return json.dumps(value)


def comparison(folder: Mapping[str, Any], engine: Mapping[str, Any], premises: Sequence[str] = ()) -> list[
        tuple[str, Any, Any, str]]:
    """Field by field: (field, the folder's value, the engine's, verdict), the verdict `equal`, `premise` (differs
    in a field the package declares its engine does not honour), `refused` (differs otherwise) or `not reported`
    (the engine's reader cannot read the field back; it is not compared)."""
    rows = []
    for field in FIELDS:
        want, got = folder.get(field), engine.get(field)
        if field not in engine:
            verdict = "not reported"
        elif same_value(field, want, got):
            verdict = "equal"
        else:
            verdict = "premise" if field in premises else "refused"
        rows.append((field, want, got, verdict))
    return rows


class ConfigMismatch(InvarError):
    """An engine computes with another configuration than the model folder's."""


def check_effective(folder: str | Path, engine: str, effective: Mapping[str, Any],
                    premises: Sequence[str] = ()) -> list[str]:
    """Refuse an engine whose effective configuration differs from the folder's in a field not in `premises`.

    Returns the differences `premises` allow (each a line, for the caller to show); raises `ConfigMismatch` with
    the first other one: the field, the folder's value, the engine's, and what to change.
    """
    lines = differences(folder_config(read_config(folder)), effective)
    allowed = [line for line in lines if line.split(":", 1)[0] in premises]
    refused = [line for line in lines if line.split(":", 1)[0] not in premises]
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        field = refused[0].split(":", 1)[0]
        raise ConfigMismatch(f"the {engine} engine does not compute the model in {folder}: {refused[0]}{more}; run "
                             "it on an engine that honours the field, or declare it a known premise in the "
                             f"package's table (known_premises = [{{field = \"{field}\", why = \"...\"}}])")
    return allowed
