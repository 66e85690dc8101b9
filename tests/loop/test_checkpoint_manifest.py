"""Training checkpoints: written atomically with a per-tensor sha256 manifest and the optimizer's moments, and every
change after the learner saved one (a flipped byte, a file added or dropped, moments of another adapter) is one
`CheckpointError` naming it. Folders are written here byte by byte (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_checkpoint import base, lora_weights, peft_tensors, report, safetensors_bytes, write  # noqa: F401

from invar import canonical
from invar.formats.checkpoint import (
    MANIFEST,
    OPTIMIZER_WEIGHTS,
    CheckpointError,
    manifest,
    save_atomically,
)
from invar.loop.checkpoint import check_checkpoint


def moments(peft: dict[str, np.ndarray], scale: float = 1.0) -> dict[str, np.ndarray]:
    return {f"{name}.{m}": (np.full_like(t, scale) if m == "exp_avg" else np.full_like(t, scale * scale))
            for name, t in peft.items() for m in ("exp_avg", "exp_avg_sq")}


def checkpoint(folder: Path, steps: int = 3) -> Path:
    peft = peft_tensors(lora_weights())

    def files(tmp: Path) -> None:
        tmp.rmdir()
        write(tmp, peft=peft)
        (tmp / OPTIMIZER_WEIGHTS).write_bytes(safetensors_bytes(moments(peft)))

    save_atomically(folder, files, optimizer_steps=steps)
    return folder


def check(folder: Path, base: Path, steps: int = 3) -> None:  # noqa: F811
    honest = report(folder)
    check_checkpoint(folder, base, reported_digest=honest["reported_digest"],
                     reported_tensors=honest["reported_tensors"], reported_steps=steps,
                     base_model_digest="0" * 64)


def test_a_checkpoint_appears_whole_under_its_name(base: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = checkpoint(tmp_path / "ck")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                         MANIFEST, OPTIMIZER_WEIGHTS]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "ck"]  # no temporary folder left
    data = json.loads((folder / MANIFEST).read_text())
    assert data == manifest(folder, optimizer_steps=3)
    check(folder, base)


def test_an_empty_folder_is_replaced_and_a_full_one_refused(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    checkpoint(tmp_path / "ck")
    with pytest.raises(OSError):  # noqa: PT011 (the OS says "directory not empty")
        checkpoint(tmp_path / "ck")


def test_a_flipped_byte_is_found_even_when_the_digest_is_retaken(base: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = checkpoint(tmp_path / "ck")
    weights = folder / "adapter_model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 1
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"adapter_model.safetensors: tensor .* does not match the manifest: its "
                                              r"bytes changed after the learner saved it"):
        check(folder, base)


def test_files_added_or_dropped_are_refused(base: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = checkpoint(tmp_path / "a")
    (folder / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match=r"holds notes\.txt, which is no part of a checkpoint"):
        check(folder, base)
    folder = checkpoint(tmp_path / "b")
    (folder / OPTIMIZER_WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match=r"lists weights files .* the folder holds"):
        check(folder, base)


def test_the_step_count_and_the_moments_must_fit(base: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = checkpoint(tmp_path / "a", steps=2)
    with pytest.raises(CheckpointError, match="records 2 optimizer steps, the learner reported 3"):
        check(folder, base)
    peft = peft_tensors(lora_weights())
    other = {k: v for k, v in moments(peft).items() if "layers.0" not in k}

    def files(tmp: Path) -> None:
        tmp.rmdir()
        write(tmp, peft=peft)
        (tmp / OPTIMIZER_WEIGHTS).write_bytes(safetensors_bytes(other))

    save_atomically(tmp_path / "b", files, optimizer_steps=3)
    with pytest.raises(CheckpointError, match="the optimizer state belongs to another adapter"):
        check(tmp_path / "b", base)


def test_the_manifest_names_every_tensor_by_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "ck")
    data = json.loads((folder / MANIFEST).read_text())
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    a = lora_weights()["model.layers.0.self_attn.q_proj"][0]
    assert data["files"]["adapter_model.safetensors"][name] == {
        "dtype": "float32", "shape": list(a.shape), "sha256": canonical.sha256(a.tobytes())}
    assert data["optimizer_steps"] == 3
