"""The core's adapter check, on adapter folders written here byte by byte (no engine): each format is accepted
when it fits the base model and the learner's report, and every defect is one `CheckpointError` naming it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar import canonical
from invar.errors import EvidenceError
from invar.formats.checkpoint import CheckpointError, inspect_adapter, read_safetensors
from invar.loop.checkpoint import check_adapter

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 16, 2, 1, 8, 24, 2
RANK, ALPHA = 4, 8
# (in, out) of the adapted modules in the base model below.
FEATURES = {"self_attn.q_proj": (16, 16), "self_attn.v_proj": (16, 8), "mlp.down_proj": (24, 16)}


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors layout: u64 little-endian header length, JSON header, then the tensors' bytes."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    data = b""
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        dtype = {"<f4": "F32", "<f2": "F16", "<i4": "I32"}[array.dtype.str]
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.fixture
def base(tmp_path: Path) -> Path:
    folder = tmp_path / "base"
    folder.mkdir()
    config = {"model_type": "qwen3", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER,
              "num_hidden_layers": LAYERS}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def lora_weights(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Module path → (A [r, in], B [out, r]) for every adapted module."""
    rng = np.random.default_rng(seed)
    return {f"model.layers.{i}.{m}": (rng.standard_normal((RANK, n_in)).astype(np.float32),
                                      rng.standard_normal((n_out, RANK)).astype(np.float32))
            for i in range(LAYERS) for m, (n_in, n_out) in FEATURES.items()}


def peft_tensors(weights: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {}
    for module, (a, b) in weights.items():
        out[f"base_model.model.{module}.lora_A.weight"] = a
        out[f"base_model.model.{module}.lora_B.weight"] = b
    return out


def mlx_tensors(weights: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {}
    for module, (a, b) in weights.items():
        out[f"{module}.lora_a"] = a.T.copy()
        out[f"{module}.lora_b"] = b.T.copy()
    return out


PEFT_CONFIG = {"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "bias": "none", "use_dora": False,
               "target_modules": ["q_proj", "v_proj", "down_proj"], "modules_to_save": None}
MLX_CONFIG = {"fine_tune_type": "lora", "num_layers": LAYERS,
              "lora_parameters": {"rank": RANK, "scale": ALPHA / RANK, "dropout": 0.0,
                                  "keys": ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]}}


def write(folder: Path, *, peft: dict[str, np.ndarray] | None = None,
          mlx: dict[str, np.ndarray] | None = None, config: dict[str, Any] | None = None,
          metadata: dict[str, str] | None = None) -> Path:
    folder.mkdir()
    merged: dict[str, Any] = {}
    if peft is not None:
        (folder / "adapter_model.safetensors").write_bytes(safetensors_bytes(peft, metadata))
        merged |= PEFT_CONFIG
    if mlx is not None:
        (folder / "adapters.safetensors").write_bytes(safetensors_bytes(mlx, metadata))
        merged |= MLX_CONFIG
    (folder / "adapter_config.json").write_text(json.dumps(config if config is not None else merged))
    return folder


def report(folder: Path) -> dict[str, Any]:
    """What an honest learner reports for `folder`."""
    tensors: dict[str, Any] = {}
    for name in ("adapter_model.safetensors", "adapters.safetensors"):
        if (folder / name).exists():
            tensors |= {k: v.report() for k, v in read_safetensors(folder / name).tensors.items()}
    return {"reported_digest": canonical.tree_digest(folder), "reported_tensors": tensors}


@pytest.mark.parametrize("formats", [("peft",), ("mlx",), ("peft", "mlx")])
def test_each_format_is_accepted_and_described(base: Path, tmp_path: Path, formats: tuple[str, ...]) -> None:
    w = lora_weights()
    folder = write(tmp_path / "a", peft=peft_tensors(w) if "peft" in formats else None,
                   mlx=mlx_tensors(w) if "mlx" in formats else None)
    adapter = check_adapter(folder, base, **report(folder))
    assert set(adapter.formats) == set(formats)
    assert (adapter.rank, adapter.scale, adapter.dtype) == (RANK, 2.0, "float32")
    assert adapter.modules == tuple(sorted(w))
    for fmt in adapter.formats.values():
        for module, (a, b) in w.items():
            got_a, got_b = fmt.pair(module)
            assert got_a.tobytes() == a.tobytes()
            assert np.ascontiguousarray(got_b).tobytes() == b.tobytes()


def test_the_digest_must_be_the_reported_one(base: Path, tmp_path: Path) -> None:
    folder = write(tmp_path / "a", peft=peft_tensors(lora_weights()))
    honest = report(folder)
    (folder / "README.md").write_text("added after the learner saved")
    with pytest.raises(CheckpointError, match="files changed after the learner saved them"):
        check_adapter(folder, base, **honest)


def test_the_tensors_must_be_the_reported_ones(base: Path, tmp_path: Path) -> None:
    folder = write(tmp_path / "a", mlx=mlx_tensors(lora_weights()))
    honest = report(folder)
    tensors = dict(honest["reported_tensors"])
    name = "model.layers.0.self_attn.q_proj.lora_a"
    with pytest.raises(CheckpointError, match="is in its files but not in the learner's report"):
        check_adapter(folder, base, reported_digest=honest["reported_digest"],
                      reported_tensors={k: v for k, v in tensors.items() if k != name})
    with pytest.raises(CheckpointError, match="the learner reported tensor extra"):
        check_adapter(folder, base, reported_digest=honest["reported_digest"],
                      reported_tensors={**tensors, "extra": {"shape": [1], "dtype": "float32"}})
    wrong = r"in its files but \{'shape': \[16, 4\], 'dtype': 'bfloat16'\}"
    with pytest.raises(CheckpointError, match=wrong):
        check_adapter(folder, base, reported_digest=honest["reported_digest"],
                      reported_tensors={**tensors, name: {"shape": [16, 4], "dtype": "bfloat16"}})
    # safetensors' own dtype names are accepted in a report.
    check_adapter(folder, base, reported_digest=honest["reported_digest"],
                  reported_tensors={**tensors, name: {"shape": [16, 4], "dtype": "F32"}})


def test_an_adapter_for_another_base_model_is_refused(base: Path, tmp_path: Path) -> None:
    w = lora_weights()
    wide = {m: (np.zeros((RANK, 32), np.float32), b) for m, (_, b) in w.items()}
    with pytest.raises(CheckpointError, match=r"needs \[4, 24\]: the adapter was made for another base"):
        inspect_adapter(write(tmp_path / "a", peft=peft_tensors(wide)), base)
    deep = {**w, "model.layers.5.self_attn.q_proj": w["model.layers.0.self_attn.q_proj"]}
    with pytest.raises(CheckpointError, match="past the base model's 2 layers"):
        inspect_adapter(write(tmp_path / "b", peft=peft_tensors(deep)), base)
    alien = {"model.layers.0.attention.wq": w["model.layers.0.self_attn.q_proj"]}
    config = {**PEFT_CONFIG, "target_modules": ["wq"]}
    with pytest.raises(CheckpointError, match="not a linear layer of the base model"):
        inspect_adapter(write(tmp_path / "c", peft=peft_tensors(alien), config=config), base)
    folder = write(tmp_path / "d", mlx=mlx_tensors(w), metadata={"invar_base_model_digest": "ab" * 32})
    with pytest.raises(CheckpointError, match="was trained on base model abababab"):
        inspect_adapter(folder, base, base_model_digest="cd" * 32)
    assert inspect_adapter(folder, base, base_model_digest="ab" * 32).rank == RANK


def test_config_and_pairing_defects(base: Path, tmp_path: Path) -> None:
    w = lora_weights()
    tensors = peft_tensors(w)
    del tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    with pytest.raises(CheckpointError, match=r"model.layers.1.mlp.down_proj has no \.lora_B\.weight tensor"):
        inspect_adapter(write(tmp_path / "a", peft=tensors), base)
    with pytest.raises(CheckpointError, match="use_dora = True is not supported"):
        inspect_adapter(write(tmp_path / "b", peft=peft_tensors(w), config={**PEFT_CONFIG, "use_dora": True}),
                        base)
    with pytest.raises(CheckpointError, match="not among target_modules"):
        inspect_adapter(write(tmp_path / "c", peft=peft_tensors(w),
                              config={**PEFT_CONFIG, "target_modules": ["q_proj"]}), base)
    with pytest.raises(CheckpointError, match="peft_type is 'IA3'"):
        inspect_adapter(write(tmp_path / "d", peft=peft_tensors(w),
                              config={**PEFT_CONFIG, "peft_type": "IA3"}), base)
    with pytest.raises(CheckpointError, match="outside the last 1 layers"):
        inspect_adapter(write(tmp_path / "e", mlx=mlx_tensors(w), config={**MLX_CONFIG, "num_layers": 1}),
                        base)
    folder = write(tmp_path / "f", peft=peft_tensors(w))
    (folder / "adapter_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"must hold adapter_config\.json"):
        inspect_adapter(folder, base)
    with pytest.raises(CheckpointError, match="holds neither"):
        inspect_adapter(write(tmp_path / "g", config=PEFT_CONFIG), base)
    half = {k: (v.astype(np.float16) if "lora_A" in k else v) for k, v in peft_tensors(w).items()}
    with pytest.raises(CheckpointError, match=r"mixes dtypes \['float16', 'float32'\]"):
        inspect_adapter(write(tmp_path / "h", peft=half), base)
    ints = {k: v.astype(np.int32) for k, v in peft_tensors(w).items()}
    with pytest.raises(CheckpointError, match="must be float32, float16 or bfloat16"):
        inspect_adapter(write(tmp_path / "i", peft=ints), base)


def test_both_formats_must_hold_the_same_adapter(base: Path, tmp_path: Path) -> None:
    w = lora_weights()
    other = mlx_tensors(w)
    other["model.layers.1.self_attn.v_proj.lora_b"] = other["model.layers.1.self_attn.v_proj.lora_b"] + 1
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.v_proj B differs between the peft and"):
        inspect_adapter(write(tmp_path / "a", peft=peft_tensors(w), mlx=other), base)
    config = {**PEFT_CONFIG, **MLX_CONFIG, "lora_parameters": {**MLX_CONFIG["lora_parameters"], "scale": 3.0}}
    with pytest.raises(CheckpointError, match=r"scale 3.0 \(mlx\) differs from 2.0 \(peft\)"):
        inspect_adapter(write(tmp_path / "b", peft=peft_tensors(w), mlx=mlx_tensors(w), config=config), base)


def test_corrupt_files_are_refused(base: Path, tmp_path: Path) -> None:
    good = safetensors_bytes(peft_tensors(lora_weights()))
    (length,) = struct.unpack("<Q", good[:8])
    cases = {
        "truncated": good[:-4],
        "short": good[:5],
        "long header": struct.pack("<Q", 10**9) + good[8:],
        "not json": good[:8] + b"{" * length + good[8 + length:],
        "trailing bytes": good + b"\0",
    }
    for i, (what, data) in enumerate(cases.items()):
        path = tmp_path / f"{i}.safetensors"
        path.write_bytes(data)
        with pytest.raises(CheckpointError) as info:
            read_safetensors(path)
        assert str(path) in str(info.value), what
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    text = json.dumps(header).encode()
    (tmp_path / "overlap.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(12))
    with pytest.raises(CheckpointError, match="overlaps or leaves a gap"):
        read_safetensors(tmp_path / "overlap.safetensors")


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_damage_to_the_header_is_a_checkpoint_error_or_harmless(data: st.DataObject) -> None:
    """Flipping bytes or cutting the file never escapes as anything but a CheckpointError."""
    import tempfile

    good = safetensors_bytes({"x.lora_A.weight": np.arange(6, dtype=np.float32).reshape(2, 3)})
    damaged = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "f.safetensors"
        path.write_bytes(bytes(damaged))
        try:
            parsed = read_safetensors(path)
        except CheckpointError:
            return
        # Whatever parsed must describe exactly the bytes present.
        total = sum(t.end - t.begin for t in parsed.tensors.values())
        assert parsed.data_start + total == len(damaged)


def test_checkpoint_errors_are_evidence_errors() -> None:
    assert issubclass(CheckpointError, EvidenceError)


def test_target_modules_follow_peft_rules(base: Path, tmp_path: Path) -> None:
    """A list names modules by a dotted suffix of their path; a string is a regular expression over it."""
    w = peft_tensors(lora_weights())
    suffixes = {**PEFT_CONFIG, "target_modules": ["self_attn.q_proj", "v_proj", "mlp.down_proj"]}
    assert inspect_adapter(write(tmp_path / "a", peft=w, config=suffixes), base).rank == RANK
    regex = {**PEFT_CONFIG, "target_modules": r"model\.layers\.\d+\.(self_attn\.[qv]_proj|mlp\.down_proj)"}
    assert inspect_adapter(write(tmp_path / "b", peft=w, config=regex), base).rank == RANK
    with pytest.raises(CheckpointError, match="is not among target_modules"):
        inspect_adapter(write(tmp_path / "c", peft=w, config={**regex, "target_modules": r".*q_proj"}), base)
    with pytest.raises(CheckpointError, match="is not a regular expression"):
        inspect_adapter(write(tmp_path / "d", peft=w, config={**regex, "target_modules": "("}), base)
