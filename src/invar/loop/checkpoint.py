"""The core's check of a learner's adapter folder and training checkpoint, before it is published to the inference
engines.

Decision: an adapter is published only when its files are exactly what the learner reported (the folder's
tree digest, every tensor's name, shape and dtype) and fit the base model, and a checkpoint only when its manifest
matches every tensor's bytes and its optimizer state fits the adapter. The formats themselves, which the learners
write and the engines load as well, are `invar.formats.checkpoint`; this module is the core's alone, so a change
to a check moves no worker's code digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar import canonical
from invar.formats.checkpoint import (
    _DTYPE_NAMES,
    ADAPTER_CONFIG,
    MANIFEST,
    MANIFEST_FORMAT,
    MOMENTS,
    OPTIMIZER_WEIGHTS,
    PEFT_WEIGHTS,
    Adapter,
    CheckpointError,
    _read_json,
    inspect_adapter,
    read_safetensors,
)


def _normalize_report(tensors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, entry in tensors.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("shape"), list | tuple):
            raise CheckpointError(f"the learner's adapter_tensors entry for {name} is not {{shape, dtype}}")
        dtype = str(entry.get("dtype"))
        out[name] = {"shape": [int(d) for d in entry["shape"]], "dtype": _DTYPE_NAMES.get(dtype, dtype)}
    return out


def check_adapter(
    adapter_dir: str | Path,
    base_model_dir: str | Path,
    *,
    reported_digest: str,
    reported_tensors: Mapping[str, Any],
    base_model_digest: str | None = None,
) -> Adapter:
    """Check a learner's adapter folder against its report and the base model, before the core publishes it.

    `reported_digest`: the `adapter_digest` of the learner's report; `reported_tensors`: its `adapter_tensors`
    ({name: {shape, dtype}}, dtype as `float32` or `F32`). Everything `inspect_adapter` checks, plus: the
    folder's tree digest equals the reported one, and the tensors are exactly the reported ones.
    Raises `CheckpointError`.
    """
    adapter = inspect_adapter(adapter_dir, base_model_dir, base_model_digest=base_model_digest)
    if adapter.digest != reported_digest:
        raise CheckpointError(f"adapter folder {adapter.path} has digest {adapter.digest[:16]}…, but the "
                              f"learner reported {reported_digest[:16]}…: its files changed after the "
                              "learner saved them")
    reported = _normalize_report(reported_tensors)
    actual = adapter.tensors
    for name in sorted(set(reported) | set(actual)):
        if name not in actual:
            raise CheckpointError(f"adapter folder {adapter.path}: the learner reported tensor {name}, "
                                  "which its files do not hold")
        if name not in reported:
            raise CheckpointError(f"adapter folder {adapter.path}: tensor {name} is in its files but not in "
                                  "the learner's report")
        if reported[name] != actual[name]:
            raise CheckpointError(f"adapter folder {adapter.path}: tensor {name} is {actual[name]} in its "
                                  f"files but {reported[name]} in the learner's report")
    return adapter


@dataclass(frozen=True)
class Checkpoint:
    """A checked training checkpoint: its adapter and the optimizer state saved with it."""

    adapter: Adapter
    optimizer_steps: int
    """Optimizer steps the saved state has taken (one per cycle)."""


def check_manifest(folder: str | Path, adapter: Adapter) -> int:
    """Check a checkpoint's manifest against its files and its optimizer file against the adapter; returns the
    optimizer's step count. Raises `CheckpointError` naming the file or tensor at fault."""
    root = Path(folder)
    data = _read_json(root / MANIFEST, "a training checkpoint holds its manifest; the learner did not finish "
                                       "saving it")
    where = root / MANIFEST
    steps = data.get("optimizer_steps")
    if data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), dict) \
            or isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise CheckpointError(f"{where}: not a {MANIFEST_FORMAT} manifest with files and optimizer_steps ≥ 1")
    listed: dict[str, Any] = data["files"]
    present = sorted(p.name for p in root.glob("*.safetensors"))
    if sorted(listed) != present:
        raise CheckpointError(f"{where}: lists weights files {sorted(listed)}, the folder holds {present}; a file "
                              "was added or removed after the learner saved it")
    allowed = {ADAPTER_CONFIG, MANIFEST, *present}
    for path in sorted(root.iterdir()):
        if path.name not in allowed:
            raise CheckpointError(f"{root}: holds {path.name}, which is no part of a checkpoint; a checkpoint holds "
                                  f"only {sorted(allowed)}")
    # The adapter's weights files were read by `inspect_adapter` moments ago: their headers are taken as read.
    headers = {w.file.path.name: w.file for w in adapter.formats.values() if w.file.path.parent == root}
    read = {}
    for name in present:
        st = read[name] = headers.get(name) or read_safetensors(root / name)
        tensors = listed[name]
        if not isinstance(tensors, dict) or sorted(tensors) != sorted(st.tensors):
            raise CheckpointError(f"{root / name}: its tensors are not the ones the manifest lists")
        # The data section read once, each tensor hashed from its slice (`SafetensorsFile.raw` opens the file for
        # every tensor); the header just read fixes where each lies, and the tree digest taken after these checks
        # covers a file changed in between.
        with open(st.path, "rb") as f:
            f.seek(st.data_start)
            section = memoryview(f.read())
        for tensor, info in st.tensors.items():
            entry = tensors[tensor]
            actual = {**info.report(), "sha256": canonical.sha256(section[info.begin:info.end])}
            if entry != actual:
                what = "bytes" if isinstance(entry, dict) and entry.get("shape") == actual["shape"] \
                    and entry.get("dtype") == actual["dtype"] else "shape or dtype"
                raise CheckpointError(f"{root / name}: tensor {tensor} does not match the manifest: its {what} "
                                      "changed after the learner saved it")
    if OPTIMIZER_WEIGHTS not in present:
        raise CheckpointError(f"{root}: holds no {OPTIMIZER_WEIGHTS}; a training checkpoint keeps the optimizer "
                              "state its next update continues from")
    opt = read[OPTIMIZER_WEIGHTS]  # read once, above: the tree digest taken after these checks covers any change
    peft = adapter.formats.get("peft")
    if peft is None:
        raise CheckpointError(f"{root}: a training checkpoint holds the adapter in PEFT's format ({PEFT_WEIGHTS})")
    want = {f"{t}.{m}": peft.file.tensors[t].shape for t in peft.file.tensors for m in MOMENTS}
    if sorted(opt.tensors) != sorted(want):
        raise CheckpointError(f"{opt.path}: must hold {', '.join(MOMENTS)} for every adapter tensor and nothing "
                              "else; the optimizer state belongs to another adapter")
    for tensor, info in opt.tensors.items():
        if info.shape != want[tensor] or info.dtype != "float32":
            raise CheckpointError(f"{opt.path}: {tensor} is {info.dtype} {list(info.shape)}, its adapter tensor "
                                  f"needs float32 {list(want[tensor])}")
    return int(steps)


def check_checkpoint(
    folder: str | Path,
    base_model_dir: str | Path,
    *,
    reported_digest: str,
    reported_tensors: Mapping[str, Any],
    reported_steps: int,
    base_model_digest: str,
) -> Checkpoint:
    """Check a learner's checkpoint before the core publishes it: everything `check_adapter` checks, the
    manifest against every tensor's bytes, the optimizer state against the adapter, and the step count the
    learner reported. Raises `CheckpointError`."""
    adapter = check_adapter(folder, base_model_dir, reported_digest=reported_digest,
                            reported_tensors=reported_tensors, base_model_digest=base_model_digest)
    steps = check_manifest(folder, adapter)
    if steps != reported_steps:
        raise CheckpointError(f"{Path(folder) / MANIFEST}: records {steps} optimizer steps, the learner reported "
                              f"{reported_steps}")
    # The manifest was read after the digest was taken; a change in between would differ from the digest.
    if canonical.tree_digest(folder) != reported_digest:
        raise CheckpointError(f"{folder}: its files changed while the core was checking them")
    return Checkpoint(adapter, steps)
