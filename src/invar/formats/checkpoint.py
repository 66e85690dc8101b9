"""The adapter and checkpoint formats: what a learner writes, an engine loads and the core checks.

Decision: what an adapter folder holds is read without an engine (`inspect_adapter`): the reader takes
`config.json` and `adapter_config.json` with `json` and each safetensors header with the standard library
(8-byte little-endian header length, then a JSON header), and checks that the adapter fits the base model (every
LoRA module exists in the base model's architecture, with the rank and the in/out features its `config.json`
implies). Learners write these files, engines load them and the core checks them against a learner's report before
it publishes them (`invar.loop.checkpoint`), so the format is a module of its own, below both.

Two formats, told apart by their weights file (both keep their settings in `adapter_config.json`):

- `peft`: `adapter_model.safetensors`, tensors `base_model.model.<module>.lora_A.weight` [r, in] and
  `.lora_B.weight` [out, r]; scale `lora_alpha / r`. Written by the HF learner and the MLX learner; loaded by
  vLLM, HF (peft) and the MLX worker.
- `mlx` (mlx-lm's): `adapters.safetensors`, tensors `<module>.lora_a` [in, r] and `.lora_b` [r, out]; scale
  `lora_parameters.scale`. Written by the MLX learner; loaded by the MLX worker (and by mlx-lm's
  `load_adapters`).

`<module>` is the module's path in the base model, e.g. `model.layers.0.self_attn.q_proj`; the adapter adds
scale · B·A·x to that linear layer's output (A [r, in], B [out, r]).

The MLX learner writes both formats into one folder, with one `adapter_config.json` holding both key sets
(each reader ignores the other's keys), so a single digest names an adapter that every engine loads. When both
are present they must hold the same adapter: the same modules and rank, `lora_alpha / r` equal to `scale`, and
A = aᵀ, B = bᵀ bit for bit (the core reads the tensors' bytes to check this).

A training **checkpoint** is such an adapter folder plus the learner's optimizer state and a manifest
(`check_checkpoint`): `optimizer.safetensors` holds AdamW's two moments of every adapter tensor, named and shaped
as the PEFT tensor they belong to (`<PEFT name>.exp_avg`, `.exp_avg_sq`, float32), so a restarted learner continues
exactly where the published one stopped; `invar-manifest.json` lists every tensor of every weights file with the
sha256 of its bytes and the optimizer's step count. Learners write a checkpoint atomically (`save_atomically`: a
temporary sibling folder, the manifest last, then one rename), so a folder under the final name is always whole.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.errors import EvidenceError
from invar.regular_files import MODEL_FILE_BYTES, read_regular_file

PEFT_WEIGHTS = "adapter_model.safetensors"
MLX_WEIGHTS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_DIGEST_KEY = "invar_base_model_digest"
"""safetensors metadata key the learners write: tree digest of the base model the adapter was trained on."""

OPTIMIZER_WEIGHTS = "optimizer.safetensors"
MANIFEST = "invar-manifest.json"
MANIFEST_FORMAT = "invar.checkpoint/1"
MOMENTS = ("exp_avg", "exp_avg_sq")
"""AdamW's first and second moments, as torch names them; the optimizer file's tensor suffixes."""

_PEFT_PREFIX = "base_model.model."
_MAX_HEADER = 100 * 1024 * 1024
"""Largest safetensors header read (the format's own limit); a longer one is a corrupt file."""

_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
"""The floating dtypes an adapter may hold, by safetensors name → the name reports use."""

_LAYER_MODULE = re.compile(r"model\.layers\.(\d+)\.((?:self_attn|mlp)\.[a-z_]+)")


class CheckpointError(EvidenceError):
    """An adapter folder that is malformed, differs from the learner's report, or does not fit the base."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file, as its header declares it."""

    dtype: str
    """Report name: `float32`, `float16` or `bfloat16` (safetensors `F32`, `F16`, `BF16`); other dtypes keep
    their safetensors name."""
    shape: tuple[int, ...]
    """Dimensions, outermost first."""
    begin: int
    """Byte offset of the data, from the start of the data section."""
    end: int
    """Byte offset one past the data."""

    def report(self) -> dict[str, Any]:
        """The form learners report: `{shape: [..], dtype: str}`."""
        return {"shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class SafetensorsFile:
    """A safetensors file's header: where each tensor lies."""

    path: Path
    data_start: int
    """Byte offset of the data section in the file (8 + header length)."""
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str]
    """The header's `__metadata__` (string → string), empty when absent."""

    def raw(self, name: str) -> bytes:
        """The tensor's bytes, as stored."""
        info = self.tensors[name]
        with open(self.path, "rb") as f:
            f.seek(self.data_start + info.begin)
            return f.read(info.end - info.begin)

    def array(self, name: str) -> np.ndarray:
        """The tensor's values: float32/float16 as such, bfloat16 as raw uint16 patterns (numpy has none)."""
        info = self.tensors[name]
        dtype = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2"}.get(info.dtype)
        if dtype is None:
            raise CheckpointError(f"{self.path}: tensor {name} has dtype {info.dtype}; "
                                  "adapters hold floats only")
        with open(self.path, "rb") as f:
            f.seek(self.data_start + info.begin)
            raw = f.read(info.end - info.begin)
        return np.frombuffer(raw, dtype=dtype).reshape(info.shape)


def read_safetensors(path: str | Path) -> SafetensorsFile:
    """Read and validate a safetensors header: names, dtypes, shapes, byte ranges that tile the data exactly.

    Raises `CheckpointError` naming the file and the defect.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist: the adapter folder must hold its weights file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: shorter than a safetensors header; the file is truncated")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise CheckpointError(f"{path}: header length {length} exceeds the file; the file is corrupt")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: the safetensors header is not JSON ({exc}); "
                              "the file is corrupt") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a map; the file is corrupt")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: __metadata__ must map strings to strings; the file is corrupt")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        where = f"{path}: tensor {name}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"{where}: expected dtype, shape and data_offsets; the file is corrupt")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}; the file is corrupt")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: malformed shape {shape!r}; the file is corrupt")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: malformed data_offsets {offsets!r}; the file is corrupt")
        if offsets[1] - offsets[0] != math.prod(shape) * _ITEMSIZE[dtype]:
            raise CheckpointError(f"{where}: {offsets[1] - offsets[0]} bytes do not hold a {dtype} tensor of "
                                  f"shape {shape}; the file is corrupt")
        tensors[name] = TensorInfo(_DTYPE_NAMES.get(dtype, str(dtype)), tuple(shape), offsets[0], offsets[1])
    # The byte ranges must tile the data section: no gap, no overlap, nothing after the last tensor.
    position = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            raise CheckpointError(f"{path}: tensor data overlaps or leaves a gap at byte {position}; "
                                  "the file is corrupt")
        position = info.end
    if 8 + length + position != size:
        raise CheckpointError(f"{path}: the file holds {size - 8 - length} data bytes but its tensors use "
                              f"{position}; the file is truncated or corrupt")
    return SafetensorsFile(path, 8 + length, tensors, metadata)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"{path} does not exist: {what}")
    raw = read_regular_file(path, "checkpoint file", limit=MODEL_FILE_BYTES, error=CheckpointError,
                            fix="a checkpoint holds the regular files it was saved with; save it again")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); rewrite it") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def _positive_int(config: Mapping[str, Any], key: str, where: Path) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class BaseModel:
    """What an adapter must fit: the base model's decoder layers and each linear's (in, out) features."""

    model_type: str
    num_layers: int
    linears: Mapping[str, tuple[int, int]]
    """Module path inside a decoder layer (e.g. `self_attn.q_proj`) → (in_features, out_features)."""

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> BaseModel:
        """Read a Llama/Qwen-style decoder's geometry from `config.json` (Qwen3, Qwen2, Llama, Mistral)."""
        path = Path(model_dir) / "config.json"
        config = _read_json(path, "point at the base model's folder")
        hidden = _positive_int(config, "hidden_size", path)
        heads = _positive_int(config, "num_attention_heads", path)
        kv_heads = heads
        if config.get("num_key_value_heads") is not None:
            kv_heads = _positive_int(config, "num_key_value_heads", path)
        head_dim = _positive_int(config, "head_dim", path) if config.get("head_dim") else hidden // heads
        inter = _positive_int(config, "intermediate_size", path)
        linears = {
            "self_attn.q_proj": (hidden, heads * head_dim),
            "self_attn.k_proj": (hidden, kv_heads * head_dim),
            "self_attn.v_proj": (hidden, kv_heads * head_dim),
            "self_attn.o_proj": (heads * head_dim, hidden),
            "mlp.gate_proj": (hidden, inter),
            "mlp.up_proj": (hidden, inter),
            "mlp.down_proj": (inter, hidden),
        }
        layers = _positive_int(config, "num_hidden_layers", path)
        return cls(str(config.get("model_type", "")), layers, linears)

    def features(self, module: str, where: str) -> tuple[int, int]:
        """(in, out) features of a module path such as `model.layers.0.self_attn.q_proj`."""
        match = _LAYER_MODULE.fullmatch(module)
        if match is None or match.group(2) not in self.linears:
            raise CheckpointError(f"{where}: module {module} is not a linear layer of the base model "
                                  f"({self.model_type}); the adapter was made for another architecture")
        if int(match.group(1)) >= self.num_layers:
            raise CheckpointError(f"{where}: module {module} is past the base model's {self.num_layers} "
                                  "layers; the adapter was made for another base model")
        return self.linears[match.group(2)]


@dataclass(frozen=True)
class LoraWeights:
    """One format's view of an adapter: its rank, scale, and the tensor names of each module's A and B."""

    format: str
    """`peft` or `mlx`."""
    file: SafetensorsFile
    rank: int
    scale: float
    """The multiplier of B·A: `lora_alpha / r` (PEFT; `/ sqrt(r)` with rsLoRA) or `scale` (MLX)."""
    modules: Mapping[str, tuple[str, str]]
    """Module path → (name of A, name of B) in `file`."""
    transposed: bool
    """True for MLX, whose tensors are Aᵀ [in, r] and Bᵀ [r, out]."""

    def pair(self, module: str) -> tuple[np.ndarray, np.ndarray]:
        """A [r, in] and B [out, r] of a module, in PEFT orientation, from the file's bytes."""
        a_name, b_name = self.modules[module]
        a, b = self.file.array(a_name), self.file.array(b_name)
        return (a.T, b.T) if self.transposed else (a, b)


def _pair_modules(
    file: SafetensorsFile, suffixes: tuple[str, str], prefix: str
) -> dict[str, tuple[str, str]]:
    a_suffix, b_suffix = suffixes
    found: dict[str, dict[str, str]] = {}
    for name in file.tensors:
        for which, suffix in (("a", a_suffix), ("b", b_suffix)):
            if name.startswith(prefix) and name.endswith(suffix):
                found.setdefault(name[len(prefix): -len(suffix)], {})[which] = name
                break
        else:
            raise CheckpointError(f"{file.path}: tensor {name} is not a LoRA {a_suffix} or {b_suffix} "
                                  "tensor; the adapter holds weights this check cannot place")
    modules: dict[str, tuple[str, str]] = {}
    for module, names in sorted(found.items()):
        if set(names) != {"a", "b"}:
            missing = a_suffix if "a" not in names else b_suffix
            raise CheckpointError(f"{file.path}: module {module} has no {missing} tensor; "
                                  "the file is incomplete")
        modules[module] = (names["a"], names["b"])
    if not modules:
        raise CheckpointError(f"{file.path}: holds no LoRA tensors")
    return modules


def _peft(folder: Path, config: Mapping[str, Any]) -> LoraWeights:
    where = folder / ADAPTER_CONFIG
    if config.get("peft_type") != "LORA":
        raise CheckpointError(f"{where}: peft_type is {config.get('peft_type')!r}; "
                              "only LORA adapters are served")
    for key, allowed in (("use_dora", (False, None)), ("fan_in_fan_out", (False, None)),
                         ("bias", ("none", None)), ("modules_to_save", (None,))):
        if config.get(key) not in allowed and config.get(key) != []:
            raise CheckpointError(f"{where}: {key} = {config.get(key)!r} is not supported; "
                                  f"train with {key} = {allowed[0]!r}")
    for key in ("rank_pattern", "alpha_pattern", "layers_to_transform"):
        if config.get(key):
            raise CheckpointError(f"{where}: {key} is set; per-module ranks and layer subsets "
                                  "are not supported")
    rank = _positive_int(config, "r", where)
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise CheckpointError(f"{where}: lora_alpha must be a positive number, got {alpha!r}")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = config.get("target_modules")
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets
                                         and all(isinstance(t, str) for t in targets))):
        raise CheckpointError(f"{where}: target_modules must name the modules the adapter adapts")
    file = read_safetensors(folder / PEFT_WEIGHTS)
    modules = _pair_modules(file, (".lora_A.weight", ".lora_B.weight"), _PEFT_PREFIX)
    for module in modules:
        # PEFT's rule: a string is a regular expression over the whole module path; a list names modules by
        # their path or a dotted suffix of it.
        if isinstance(targets, str):
            try:
                targeted = re.fullmatch(targets, module) is not None
            except re.error as exc:
                raise CheckpointError(f"{where}: target_modules {targets!r} is not a regular expression "
                                      f"({exc})") from None
        else:
            targeted = any(module == t or module.endswith("." + t) for t in targets)
        if not targeted:
            raise CheckpointError(f"{file.path}: module {module} is not among target_modules {targets}")
    return LoraWeights("peft", file, rank, float(scale), modules, transposed=False)


def _mlx(folder: Path, config: Mapping[str, Any], base: BaseModel) -> LoraWeights:
    where = folder / ADAPTER_CONFIG
    if config.get("fine_tune_type", "lora") != "lora":
        raise CheckpointError(f"{where}: fine_tune_type is {config.get('fine_tune_type')!r}; "
                              "only lora is served")
    params = config.get("lora_parameters")
    if not isinstance(params, dict):
        raise CheckpointError(f"{where}: lora_parameters (rank, scale) is missing")
    rank = _positive_int(params, "rank", where)
    scale = params.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise CheckpointError(f"{where}: lora_parameters.scale must be a number, got {scale!r}")
    num_layers = _positive_int(config, "num_layers", where)
    keys = params.get("keys")
    if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
        raise CheckpointError(f"{where}: lora_parameters.keys must be a list of module paths such as "
                              "'self_attn.q_proj'")
    file = read_safetensors(folder / MLX_WEIGHTS)
    modules = _pair_modules(file, (".lora_a", ".lora_b"), "")
    for module in modules:
        match = _LAYER_MODULE.fullmatch(module)
        # mlx-lm adapts the last `num_layers` layers, only the `keys` modules when keys are given.
        if match is not None and int(match.group(1)) < base.num_layers - num_layers:
            raise CheckpointError(f"{file.path}: module {module} lies outside the last {num_layers} layers "
                                  "that num_layers names")
        if match is not None and keys is not None and match.group(2) not in keys:
            raise CheckpointError(f"{file.path}: module {module} is not among lora_parameters.keys {keys}")
    return LoraWeights("mlx", file, rank, float(scale), modules, transposed=True)


@dataclass(frozen=True)
class Adapter:
    """A checked adapter folder."""

    path: Path
    digest: str
    """Tree digest of the folder (`invar.canonical.tree_digest`)."""
    formats: Mapping[str, LoraWeights]
    """Format name (`peft`, `mlx`) → that format's weights; the MLX learner writes both."""
    rank: int
    scale: float
    modules: tuple[str, ...]
    """Module paths the adapter adapts, sorted."""
    dtype: str
    """The one dtype all its tensors share."""

    @property
    def tensors(self) -> dict[str, dict[str, Any]]:
        """Every tensor of every weights file: name → {shape, dtype} (the formats' names never collide)."""
        return {name: info.report() for w in self.formats.values() for name, info in w.file.tensors.items()}


def inspect_adapter(
    adapter_dir: str | Path, base_model_dir: str | Path, *, base_model_digest: str | None = None
) -> Adapter:
    """Read an adapter folder and check that it is well formed and fits the base model in `base_model_dir`.

    Checks, for each format present: the config keys that fix the adapter's meaning, every tensor name, that
    each module has A and B, shapes A [r, in] and B [out, r] for the base model's (in, out) features, and one
    floating dtype throughout; with both formats, that they hold the same values; and, when
    `base_model_digest` is given and a weights file names the base it was trained on (metadata
    `invar_base_model_digest`), that the two agree. Raises `CheckpointError`.
    """
    folder = Path(adapter_dir)
    if not folder.is_dir():
        raise CheckpointError(f"adapter folder {folder} does not exist; pass the folder the learner saved")
    config = _read_json(folder / ADAPTER_CONFIG, "an adapter folder must hold adapter_config.json")
    base = BaseModel.from_dir(base_model_dir)
    formats: dict[str, LoraWeights] = {}
    if (folder / PEFT_WEIGHTS).exists():
        formats["peft"] = _peft(folder, config)
    if (folder / MLX_WEIGHTS).exists():
        formats["mlx"] = _mlx(folder, config, base)
    if not formats:
        raise CheckpointError(f"adapter folder {folder} holds neither {PEFT_WEIGHTS} (PEFT) "
                              f"nor {MLX_WEIGHTS} (MLX)")
    dtypes: set[str] = set()
    for weights in formats.values():
        trained_on = weights.file.metadata.get(BASE_DIGEST_KEY)
        if base_model_digest is not None and trained_on is not None and trained_on != base_model_digest:
            raise CheckpointError(f"{weights.file.path} was trained on base model {trained_on[:16]}…, not "
                                  f"{base_model_digest[:16]}…: use the adapter with its own base model")
        for module, (a_name, b_name) in weights.modules.items():
            n_in, n_out = base.features(module, str(weights.file.path))
            r = weights.rank
            want = ((n_in, r), (r, n_out)) if weights.transposed else ((r, n_in), (n_out, r))
            for name, shape in zip((a_name, b_name), want, strict=True):
                info = weights.file.tensors[name]
                if info.shape != shape:
                    raise CheckpointError(
                        f"{weights.file.path}: tensor {name} has shape {list(info.shape)}, but rank {r} on "
                        f"the base model's {module} ({n_in} in, {n_out} out) needs {list(shape)}: the "
                        "adapter was made for another base model or rank")
                if info.dtype not in ("float32", "float16", "bfloat16"):
                    raise CheckpointError(f"{weights.file.path}: tensor {name} has dtype {info.dtype}; "
                                          "LoRA weights must be float32, float16 or bfloat16")
                dtypes.add(info.dtype)
    if len(dtypes) != 1:
        raise CheckpointError(f"adapter folder {folder} mixes dtypes {sorted(dtypes)}; save it in one dtype")
    first, *others = formats.values()
    for other in others:
        if set(other.modules) != set(first.modules) or other.rank != first.rank:
            raise CheckpointError(f"adapter folder {folder}: the {first.format} and {other.format} weights "
                                  "adapt different modules or ranks; both files must hold the same adapter")
        if not math.isclose(other.scale, first.scale, rel_tol=1e-12):
            raise CheckpointError(f"adapter folder {folder}: scale {other.scale} ({other.format}) differs "
                                  f"from {first.scale} ({first.format}); make lora_alpha / r equal the scale")
        for module in first.modules:
            for x, y, what in zip(first.pair(module), other.pair(module), ("A", "B"), strict=True):
                if x.tobytes() != np.ascontiguousarray(y).tobytes():
                    raise CheckpointError(f"adapter folder {folder}: {module} {what} differs between the "
                                          f"{first.format} and {other.format} weights; both must hold the "
                                          "same adapter")
    return Adapter(folder, canonical.tree_digest(folder), formats, first.rank, first.scale,
                   tuple(sorted(first.modules)), dtypes.pop())


# -- training checkpoints: adapter + optimizer state + manifest, as learners write them -------------


def manifest(folder: str | Path, *, optimizer_steps: int) -> dict[str, Any]:
    """The manifest of a checkpoint folder: every tensor of every `.safetensors` file, with its dtype, shape and
    the sha256 of its bytes, and the optimizer's step count."""
    root = Path(folder)
    files: dict[str, Any] = {}
    for path in sorted(root.glob("*.safetensors")):
        st = read_safetensors(path)
        files[path.name] = {name: {**info.report(), "sha256": canonical.sha256(st.raw(name))}
                            for name, info in sorted(st.tensors.items())}
    return {"format": MANIFEST_FORMAT, "files": files, "optimizer_steps": optimizer_steps}


def save_atomically(folder: str | Path, write: Any, *, optimizer_steps: int) -> None:
    """Write a checkpoint into `folder` so that it appears whole or not at all.

    `write(tmp)` writes the adapter and optimizer files into a temporary sibling folder; the manifest is written
    last, every file is flushed to disk, and the folder is renamed into place (an empty `folder` is replaced).
    A process killed before the rename leaves only the temporary folder, never a partial `folder`.
    """
    import os

    final = Path(folder)
    tmp = final.with_name(f".{final.name}.partial-{os.getpid()}")
    tmp.mkdir(parents=True)
    write(tmp)
    (tmp / MANIFEST).write_text(json.dumps(manifest(tmp, optimizer_steps=optimizer_steps), indent=1,
                                           sort_keys=True) + "\n", encoding="utf-8")
    for path in sorted(tmp.iterdir()):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    os.rename(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
