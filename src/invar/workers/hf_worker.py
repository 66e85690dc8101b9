"""The Hugging Face worker: transformers (with bitsandbytes for NF4) as an inference engine and as the learner.

    python -m invar.workers.hf_worker --role inference|learner [--threads N] [--device cpu|cuda]
        [--attn-implementation sdpa|eager] [--patch NAME=SHA256 ...] [--patch-poison NAME]
        [--learner-channel IN,OUT]

Decisions this worker embodies:

- **Determinism first.** `torch.use_deterministic_algorithms(True)`, a fixed intra-op thread count (`--threads`,
  default 1) and one inter-op thread; all three are in the identity's `settings`, since thread count can change how
  a reduction is split. The same call on the same worker build gives the same bits.
- **One code path for `generate` and `score`.** Both run a batch the same way: the prompts left-padded into one
  prefill, then one token per step through a KV cache. They differ only in where each step's token comes from
  (drawn, or given). So `score` of generated tokens, with the items in the same batch composition and order, gives
  the bits `generate` reported: teacher forcing on this engine agrees with its own sampling exactly, by
  construction. A request alone and the same request inside a larger batch are NOT bit-identical here: the
  matrix products change their blocking with the batch shape (the tests measure and report the difference).
- **Sampling.** Temperature T > 0 draws from softmax(logits/T), truncated to top-p when top_p < 1. `logprobs` are
  log_softmax(logits/T) in float32 at the drawn token, before the top-p truncation. T = 0 is greedy (first
  maximum) and its logprobs are at T = 1. Each request has its own `torch.Generator` seeded by the request's seed,
  used for nothing else, so what shares its batch cannot change which uniforms it consumes.
- **LoRA runs through peft**: the first adapter wraps the model with `get_peft_model` (a `LoraConfig` per adapter,
  targeting exactly the modules the adapter's file adapts), later ones are added with `add_adapter`, a call selects
  its adapter with `set_adapter` or the base model with `disable_adapter`, and a replaced adapter is dropped with
  `delete_adapter` (peft's names are the worker's own, `invar<n>`, so any name a caller gives is safe). peft's LoRA
  layer computes y = base(x) + B(A(x))·alpha/r in the adapter's float32, as the worker's own layer did before it
  (tests/workers/hf/test_hf_peft.py shows every log-probability and the saved weights unchanged by the switch). Each
  folder is read and checked by the worker first (PEFT's format, shapes, the base model's digest in the weights'
  metadata), then its tensors are copied into peft's layers. The adapter's weights are float32 whatever the base
  (FP32, BF16 or NF4).
- **Adapter names in calls**: null is the model as loaded (the adapter given to `load_model`, or on the learner the
  adapter being trained; the base model if there is none), `"base"` is the base model alone, any other name is one
  given to `load_adapter`.
- **The learner** scores the engine's sampled tokens itself in one teacher-forced forward (right padded) with
  autograd on; those values, taken with the weights the update starts from, are the proximal log-probabilities.
  A batch whose float32 logits would pass `LOGITS_BUDGET` (64 MiB; a real vocabulary, not the shipped model's) is
  scored with memory bounded: each decoder layer keeps only its input and recomputes its activations in backward,
  and the output projection and log-softmax run on the response positions only, in chunks recomputed in backward,
  each projected as at least `HEAD_ROWS` rows: the same operations on the same rows, measured bit-identical to the
  model's own forward on AMD and Intel CPUs with AVX-512 (`Engine._bounded_logprobs`, docs/training.md).
  The objective is `invar.loop.objective`'s, computed per token in float32 (importance weight exp(proximal −
  behavior), exactly 1 where they are equal, then truncated or masked at the cap when asked); the reported terms sum
  those float32 values in float64 as the core does. One AdamW step on the adapter's float32 parameters follows. The
  optimizer state persists across `learner_step` calls while the same adapter is trained (one update per cycle
  follows another); `load_model` starts a new adapter and a new optimizer state, or, with `adapter.resume`, restores
  the state saved with the checkpoint. LoRA dropout must be 0, so the first step's ratio is exactly 1.
- **Checkpoints** (`invar.formats.checkpoint`) are written atomically: peft's `LoraConfig.save_pretrained` writes the
  config and `get_peft_model_state_dict` gives the weights, saved with the base model's tree digest in their
  metadata (not `PeftModel.save_pretrained`, which also writes a model card naming local paths, puts each adapter
  but "default" in a subfolder and has no place for that metadata); AdamW's moments go beside them, then the
  manifest, then one rename.
- **One NF4 path.** bitsandbytes repacks NF4 weights for a CPU kernel in eval mode on CPUs with AVX512-BF16, and
  that kernel has no backward (the learner's adapter would silently get no gradient). The worker turns the repacking
  off, so inference and the learner both dequantize to the compute dtype and then multiply.
- **Prompts arrive as token ids** (`prompt_ids`, the core's tokenization with the model's own tokenizer): the
  worker never tokenizes text, so every engine runs exactly the ids the core asked for, and it reports them back
  as `prompt_tokens`. An id outside [0, vocab_size) is refused.
- Bad input (missing or mismatched folders, prompt ids outside the vocabulary, a corrupt adapter, an over-long
  request) is a `MethodError` naming what to change, raised before any state changes, so the worker keeps serving
  what it had.
- **Candidate patches and kernels** (`--patch REFERENCE=SHA256`, a name under `patches/` or a folder anywhere):
  checked against their digest and applied before any model loads (`invar.workers.common.load_patches`; a function
  kernel through `invar.workers.kernel_host`); under a `patch.py` patch or a softmax kernel the model runs with eager
  attention, since SDPA's fused CPU kernel would bypass the patched matrix products and softmax; any other kernel
  keeps SDPA (`--attn-implementation eager` runs an unpatched model eagerly too: a package setting, so eager-vs-SDPA
  is a candidate of its own). The identity's settings gain
  `patches` (and `patch_poison`), and `generate` / `score` results gain `patch_calls`, the patched ops each call
  ran.
- **Both roles in one process** (`--learner-channel`, the training loop's shared layout): an inference engine and a
  learner engine, each its own `Engine` with its own model, adapters and optimizer state, served on their own
  channels under their own identities (the same settings: one process has one torch thread setting), their methods
  run one at a time. Each call then runs what it would run in a worker of its role alone.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.checkpoint
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging as hf_logging

from invar import __version__, canonical
from invar.formats.checkpoint import BASE_DIGEST_KEY, MANIFEST, MOMENTS, OPTIMIZER_WEIGHTS, save_atomically
from invar.protocol import MethodError, Role, Server, exit_worker
from invar.protocol.methods import GENERATE, LEARNER_STEP, LOAD_ADAPTER, LOAD_MODEL, SCORE, serves
from invar.protocol.payloads import (
    FinishReason,
    GenerateOutput,
    GenerateParams,
    GenerateResult,
    LearnerSample,
    LearnerStepParams,
    LearnerStepResult,
    LoadAdapterParams,
    LoadAdapterResult,
    LoadModelParams,
    LoadModelResult,
    LoraParams,
    ScoreOutput,
    ScoreParams,
    ScoreResult,
)
from invar.protocol.server import add_channel_argument, serve_roles
from invar.workers.common import (
    ADAPTER_WEIGHTS,
    PatchRefused,
    add_patch_arguments,
    check_prompt_ids,
    check_tokens,
    check_trained_on,
    load_patches,
    read_lora_config,
    response_end_ids,
    verify_dir,
    versions,
)
from invar.workers.effective import hf_effective

PEFT_PREFIX = "base_model.model."
LOADED = "@loaded"
"""Internal name of the adapter a call names with null: the one `load_model` loaded, or the one being trained."""
_KEY = re.compile(r"base_model\.model\.(.+)\.lora_([AB])(?:\.default)?\.weight")
LOGITS_BUDGET = 1 << 26
"""Bytes of float32 logits ([positions, vocabulary]) the learner's forward holds at once, 64 MiB. A batch whose
logits (rows × width × vocabulary) pass it is scored with memory bounded (`Engine._bounded_logprobs`): decoder
layers recomputed in backward, the output projection on the response positions only, in chunks of this size. The
shipped model's batches stay far below it (its vocabulary has 18 tokens) and take the model's own forward."""
HEAD_ROWS = 16
"""Fewest rows the bounded path's output projection multiplies at once (a shorter chunk is padded with zero rows and
the padding's logits dropped). MKL's float32 matrix product takes another code path for a product of few rows and
rounds its rows differently from the same rows inside a larger product: measured with one thread, on an AMD EPYC
(AVX-512) the learner's chunks of 1-3 positions on the shipped model and of 4 on SmolLM2-135M, and on an Intel Xeon
with AVX-512 and AMX products below 6 rows (width 128, the shipped model) and below 16 (width 576, vocabulary
49,152); from 16 rows on, every chunk measured gave the whole product's bits on both, forward and backward
(docs/training.md)."""


# -- LoRA -----------------------------------------------------------------------------------------------------------


@dataclass
class Adapter:
    """A LoRA adapter: per module name, A [r, in] and B [out, r], float32 (once installed, peft's own parameters)."""

    weights: dict[str, tuple[Any, Any]]
    r: int
    alpha: float
    target_modules: list[str]
    """As its config names them (written back when it is saved)."""
    digest: str | None
    """Tree digest of the folder it was read from or last saved to; None for a fresh, unsaved adapter."""
    key: str = ""
    """peft's name for it, once installed."""


def _base_layer(module: Any) -> Any:
    """A module's own linear layer: the one peft wraps, or the module itself."""
    lora = sys.modules.get("peft.tuners.lora")  # peft is imported with the first adapter; before it, none is wrapped
    return module.get_base_layer() if lora is not None and isinstance(module, lora.LoraLayer) else module


def _target_names(model: Any, targets: Sequence[str]) -> list[str]:
    """Module names a LoRA `target_modules` list selects (PEFT's rule: the name or its last components), in order."""
    names = []
    for name, module in model.named_modules():
        if ".base_layer" in name or ".lora_" in name or "lm_head" in name:
            continue
        if not isinstance(_base_layer(module), nn.Linear):
            continue
        if any(name == t or name.endswith("." + t) for t in targets):
            names.append(name)
    return names


def _read_adapter(path: str, digest: str, model: Any, model_digest: str, where: str) -> Adapter:
    """Read and check a PEFT LoRA folder against the loaded model; nothing in the model changes here."""
    config, config_path, weights_path = read_lora_config(
        path, where, ("use_dora", "use_rslora", "modules_to_save", "rank_pattern", "alpha_pattern"))
    r, alpha, targets = config.get("r"), config.get("lora_alpha"), config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, int | float) or not isinstance(targets, list):
        raise MethodError(f"{where}: {config_path} needs r (int ≥ 1), lora_alpha and target_modules")
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise MethodError(f"{where}: {weights_path} cannot be read ({exc}); the adapter is corrupt") from None
    check_trained_on(metadata, model_digest, path, where)
    modules = {name: _base_layer(module) for name, module in model.named_modules()}
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        m = _KEY.fullmatch(key)
        if m is None:
            raise MethodError(f"{where}: adapter tensor {key!r} is not a LoRA A/B weight; the adapter is not plain "
                              "LoRA or is corrupt")
        pairs.setdefault(m.group(1), {})[m.group(2)] = tensor
    weights: dict[str, tuple[Any, Any]] = {}
    for name, ab in sorted(pairs.items()):
        module = modules.get(name)
        if module is None or not isinstance(module, nn.Linear):
            raise MethodError(f"{where}: adapter {path!r} targets module {name!r}, which this model does not have: "
                              "the adapter is for another base model")
        if set(ab) != {"A", "B"}:
            raise MethodError(f"{where}: adapter {path!r} has only lora_{''.join(ab)} for {name!r}; it is corrupt")
        a, b = ab["A"], ab["B"]
        if tuple(a.shape) != (r, module.in_features) or tuple(b.shape) != (module.out_features, r):
            raise MethodError(
                f"{where}: adapter {path!r} has shapes A {tuple(a.shape)}, B {tuple(b.shape)} for {name!r}, but this "
                f"model needs A ({r}, {module.in_features}), B ({module.out_features}, {r}): the adapter is for "
                "another base model")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise MethodError(f"{where}: adapter {path!r} weights for {name!r} are not floating point; it is corrupt")
        weights[name] = (a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous())
    if not weights:
        raise MethodError(f"{where}: adapter {path!r} holds no LoRA weights")
    return Adapter(weights, r, float(alpha), sorted(str(t) for t in targets), digest)


def _write_checkpoint(folder: Path, state: dict[str, Any], moments: dict[str, Any], adapter: Adapter,
                      model_digest: str) -> None:
    """The checkpoint's files (into the temporary folder `save_atomically` gives): peft's config, the weights with
    the base model's digest in their metadata, AdamW's moments. The bytes depend only on the weights and settings
    (no paths, no times)."""
    from peft import LoraConfig

    # peft annotates lora_alpha as an int; it scales by the float alpha / r as given (as the adapter's file says).
    LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, target_modules=adapter.target_modules,  # type: ignore[arg-type]
               lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", inference_mode=True).save_pretrained(str(folder))
    # peft keeps target_modules as a set and writes it in the process's hash order: sort it, or one adapter would
    # have two spellings (two digests) across processes.
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["target_modules"] = sorted(config["target_modules"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    # One metadata key: safetensors writes its metadata map in a random order per process, so two keys would give
    # the same adapter two spellings (two digests).
    save_file(state, str(folder / ADAPTER_WEIGHTS), metadata={BASE_DIGEST_KEY: model_digest})
    save_file(moments, str(folder / OPTIMIZER_WEIGHTS))


# -- the engine -----------------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One sequence of a batch: a generate request, or a score item (`forced` tokens given)."""

    prompt_ids: list[int]
    temperature: float
    top_p: float = 1.0
    max_tokens: int = 0
    generator: Any = None
    forced: np.ndarray | None = None
    vocab_steps: list[int] = field(default_factory=list)


@dataclass
class RowResult:
    tokens: list[int]
    logprobs: list[Any]
    vocab: list[Any]
    finish_reason: FinishReason


@dataclass
class Trainer:
    """The learner's adapter under training and its optimizer (kept across steps)."""

    adapter: Adapter
    params: list[Any]
    """peft's LoRA parameters of the adapter, by module name in sorted order, A then B."""
    names: list[str]
    """Each parameter's tensor name in PEFT's saved format."""
    optimizer: Any = None
    steps: int = 0


@dataclass
class Loaded:
    model: Any
    model_dir: str
    model_digest: str
    dtype: str
    quantization: str
    eos_ids: frozenset[int]
    pad_id: int
    vocab_size: int
    max_len: int
    peft: Any = None
    """The `PeftModel` wrapping `model` once an adapter is installed (peft injects its LoRA layers into `model`)."""
    adapters: dict[str, Adapter] = field(default_factory=dict)
    plain_head: bool | None = None
    """Whether the logits are the output projection of the decoder's hidden states (`Engine._plain_head`); None
    until a learner step first needs to know."""


class Engine:
    def __init__(self, role: Role, device: str) -> None:
        self.role = role
        self.device = device
        self.m: Loaded | None = None
        self.trainer: Trainer | None = None
        self.installed = 0
        """Adapters installed so far: peft's next adapter name is `invar<installed>`."""
        self.attn_implementation = "sdpa"
        """`eager` when a patch is applied: SDPA's fused CPU kernel would bypass the patched matmul and softmax."""

    # -- loading ----------------------------------------------------------------------------------------------

    def loaded(self, where: str) -> Loaded:
        if self.m is None:
            raise MethodError(f"{where}: no model is loaded; call load_model first")
        return self.m

    def load_model(self, params: LoadModelParams) -> LoadModelResult:
        req = params.require(("float32", "bfloat16"), ("none", "nf4"))
        digest = verify_dir(req.model_dir, req.model_digest, "model")
        dtype = getattr(torch, req.dtype)
        try:
            kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": self.attn_implementation}
            if req.quantization == "nf4":
                from transformers import BitsAndBytesConfig

                kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]  # unannotated
                    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
                kwargs["device_map"] = self.device
            model = AutoModelForCausalLM.from_pretrained(req.model_dir, **kwargs)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise MethodError(f"load_model: {req.model_dir!r} cannot be loaded as a causal LM "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                              "pass a transformers model folder") from None
        if req.quantization == "none":
            # transformers wraps `to` in a decorator whose type mypy reads as unbound (the model first).
            model = model.to(self.device)  # type: ignore[arg-type]
        if req.quantization == "nf4":
            import bitsandbytes

            for module in model.modules():
                # bitsandbytes repacks NF4 weights for a CPU kernel (eval mode, AVX512-BF16) that has no backward and
                # computes in bfloat16: the learner would silently get no gradient. One NF4 path for both roles.
                if isinstance(module, bitsandbytes.nn.Linear4bit):  # type: ignore[attr-defined]  # not re-exported
                    module.support_avx512bf16_for_cpu = False
        model.eval()  # type: ignore[no-untyped-call]  # transformers' override is unannotated
        model.requires_grad_(False)
        cfg = model.config
        eos_ids = response_end_ids(req.model_dir)  # generation_config.json's, as the core's (not config.json's)
        loaded = Loaded(
            model=model, model_dir=req.model_dir, model_digest=digest, dtype=req.dtype,
            quantization=req.quantization, eos_ids=eos_ids,
            pad_id=cfg.pad_token_id if cfg.pad_token_id is not None else min(eos_ids),
            vocab_size=int(cfg.vocab_size), max_len=int(cfg.max_position_embeddings))
        adapter = None
        if req.adapter is not None:
            a_digest = verify_dir(req.adapter.path, req.adapter.digest, "adapter")
            adapter = _read_adapter(req.adapter.path, a_digest, model, digest, "load_model.adapter")
        if req.adapter_resume and self.role != Role.LEARNER:
            raise MethodError("load_model.adapter.resume: only a learner continues training an adapter")
        moments = None
        if req.adapter_resume:
            assert req.adapter is not None
            assert adapter is not None
            moments = _read_moments(Path(req.adapter.path), adapter)
        # Everything is checked: now replace what was loaded.
        self.m, self.trainer = loaded, None
        if adapter is not None:
            self._install(LOADED, adapter)
            if self.role == Role.LEARNER:
                self._train(adapter)
                if moments is not None:
                    self._restore(*moments)
        return LoadModelResult(digest, None if adapter is None else adapter.digest, loaded.vocab_size, min(eos_ids),
                               loaded.max_len, None if self.trainer is None else self.trainer.steps,
                               effective_config=hf_effective(model))

    def load_adapter(self, req: LoadAdapterParams) -> LoadAdapterResult:
        m = self.loaded("load_adapter")
        actual = verify_dir(req.path, req.digest, "adapter")
        adapter = _read_adapter(req.path, actual, m.model, m.model_digest, "load_adapter")
        self._install(req.name, adapter)
        return LoadAdapterResult(req.name, actual)

    def _install(self, name: str, adapter: Adapter) -> None:
        """Add `adapter` to peft under a fresh name and copy its tensors in; drop the adapter `name` replaces."""
        # peft (and the bitsandbytes it imports) only with the first adapter: a worker without adapters starts ~3 s
        # sooner.
        from peft import LoraConfig, get_peft_model

        m = self.loaded("load_adapter")
        key = f"invar{self.installed}"
        config = LoraConfig(r=adapter.r, lora_alpha=adapter.alpha,  # type: ignore[arg-type]  # a float, as above
                            target_modules=sorted(adapter.weights), lora_dropout=0.0, bias="none",
                            task_type="CAUSAL_LM")
        if m.peft is None:
            m.peft = get_peft_model(m.model, config, adapter_name=key)
        else:
            m.peft.add_adapter(key, config)
        self.installed += 1
        modules = dict(m.model.named_modules())
        with torch.no_grad():
            for module_name, (a, b) in sorted(adapter.weights.items()):
                layer = modules[module_name]
                layer.lora_A[key].weight.copy_(a)
                layer.lora_B[key].weight.copy_(b)
        adapter.weights = {k: (modules[k].lora_A[key].weight, modules[k].lora_B[key].weight)
                           for k in sorted(adapter.weights)}
        old = m.adapters.get(name)
        adapter.key = key
        m.adapters[name] = adapter
        if old is not None:
            m.peft.delete_adapter(old.key)

    def _key(self, name: Any, where: str) -> str | None:
        """The internal adapter key a call's adapter name selects; None is the base model."""
        m = self.loaded(where)
        if name is None:
            return LOADED if LOADED in m.adapters else None
        if name == "base":
            return None
        if not isinstance(name, str) or name not in m.adapters or name == LOADED:
            known = sorted(k for k in m.adapters if k != LOADED)
            raise MethodError(f"{where}: adapter {name!r} is not loaded; load it with load_adapter first "
                              f"(loaded: {known or 'none'}; null is the model as loaded, 'base' the base model)")
        return name

    @contextlib.contextmanager
    def active(self, key: str | None) -> Iterator[None]:
        """Run with the adapter `key` names (`set_adapter`), or with none (`disable_adapter`: the base model)."""
        m = self.loaded("call")
        if m.peft is None:
            yield
        elif key is None:
            with m.peft.disable_adapter():
                yield
        else:
            m.peft.set_adapter(m.adapters[key].key)
            yield

    # -- tokens -----------------------------------------------------------------------------------------------

    def prompt(self, ids: list[int], where: str) -> list[int]:
        check_prompt_ids(ids, self.loaded(where).vocab_size, where)
        return ids

    def check_length(self, prompt_len: int, new_tokens: int, where: str) -> None:
        m = self.loaded(where)
        if prompt_len + new_tokens > m.max_len:
            raise MethodError(f"{where}: {prompt_len} prompt tokens + {new_tokens} response tokens exceed the "
                              f"model's maximum length {m.max_len}; shorten the prompt or lower max_tokens")

    # -- the shared decoding loop -----------------------------------------------------------------------------

    def run_batch(self, rows: list[Row]) -> list[RowResult]:
        """Prefill the left-padded prompts, then one token per step through a KV cache, for every row together.

        A row's token at step t is drawn from its own generator (generate) or given (score, `forced`); either way
        the step's log-probabilities are log_softmax(logits / T) in float32, with T = 1 for greedy rows.
        """
        m = self.loaded("run")
        n = len(rows)
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((n, width), m.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        steps = max(len(r.forced) if r.forced is not None else r.max_tokens for r in rows)
        results = [RowResult([], [], [], "length") for _ in rows]
        done = [False] * n
        cache = DynamicCache(config=m.model.config)
        # Rows grouped by their divisor: one log_softmax per group and step instead of one per row. Each row's
        # values are those of the row alone (the CPU and CUDA kernels reduce each row on its own; the division is
        # elementwise by the same scalar), so the bits are the per-row loop's: bench/decode_loop.py digest pins them.
        groups: dict[float, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r.temperature if r.temperature > 0 else 1.0, []).append(i)
        plan = [(t, torch.tensor(idx, device=self.device)) for t, idx in groups.items()]
        whole = len(plan) == 1
        greedy = [r.forced is None and r.temperature == 0 for r in rows]
        vocab_steps = [set(r.vocab_steps) for r in rows]
        with torch.no_grad():
            out = m.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                          use_cache=True, logits_to_keep=1)
            for step in range(steps):
                logits = out.logits[:, -1, :].float()
                if whole:
                    lp_all = torch.log_softmax(logits / plan[0][0], dim=-1)
                else:
                    lp_all = torch.empty_like(logits)
                    for t, at in plan:
                        lp_all[at] = torch.log_softmax(logits[at] / t, dim=-1)
                # One host copy a step: the logprobs (and greedy rows' argmax) read as numpy, not per token.
                lp_host = lp_all.cpu().numpy()
                _check_finite(lp_host, done, step)
                top = logits.argmax(-1).tolist() if any(greedy) else None
                nxt = []
                for i, r in enumerate(rows):
                    if done[i]:
                        nxt.append(m.pad_id)
                        continue
                    if r.forced is not None:
                        token = int(r.forced[step])
                    elif greedy[i]:
                        assert top is not None
                        token = top[i]
                    else:
                        token = _draw(lp_all[i], r.top_p, r.generator)
                    res = results[i]
                    res.tokens.append(token)
                    res.logprobs.append(lp_host[i, token])
                    if step in vocab_steps[i]:
                        res.vocab.append(lp_host[i].copy())
                    if r.forced is not None:
                        done[i] = step + 1 == len(r.forced)
                    elif token in m.eos_ids:
                        done[i], res.finish_reason = True, "stop"
                    else:
                        done[i] = step + 1 == r.max_tokens
                    nxt.append(token)
                if all(done):
                    break
                mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long, device=self.device)], dim=1)
                positions = positions[:, -1:] + 1
                out = m.model(input_ids=torch.tensor(nxt, device=self.device)[:, None], attention_mask=mask,
                              position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return results

    # -- methods ----------------------------------------------------------------------------------------------

    def generate(self, call: GenerateParams) -> GenerateResult:
        m = self.loaded("generate")
        requests = call.requests
        key = self._key(call.adapter, "generate.adapter")
        ref = call.reference_adapter
        ref_key = self._key(ref, "generate.reference_adapter") if ref is not None else None
        prompt_ids = []
        for i, req in enumerate(requests):
            where = f"generate.requests[{i}]"
            prompt_ids.append(self.prompt(list(req.prompt_ids), where))
            self.check_length(len(prompt_ids[-1]), req.max_tokens, where)
        outputs: list[GenerateOutput | None] = [None for _ in requests]
        for batch in call.batches:
            rows = [Row(prompt_ids[i], requests[i].temperature, requests[i].top_p, requests[i].max_tokens,
                        torch.Generator(device=self.device).manual_seed(requests[i].seed)) for i in batch]
            with self.active(key):
                results = self.run_batch(rows)
            if ref is not None:
                forced = [Row(prompt_ids[i], requests[i].temperature or 1.0,
                              forced=np.asarray(res.tokens, dtype=np.int64)) for i, res in zip(batch, results,
                                                                                              strict=True)]
                with self.active(ref_key):
                    ref_results = self.run_batch(forced)
            for j, i in enumerate(batch):
                res = results[j]
                outputs[i] = GenerateOutput(
                    requests[i].request_id, np.asarray(prompt_ids[i], dtype=np.int32),
                    np.asarray(res.tokens, dtype=np.int32), _f32(res.logprobs), res.finish_reason,
                    reference_logprobs=None if ref is None else _f32(ref_results[j].logprobs))
        return GenerateResult([o for o in outputs if o is not None], m.model_digest, self._digest(key),
                              packed=call.packed)

    def score(self, call: ScoreParams) -> ScoreResult:
        m = self.loaded("score")
        key = self._key(call.adapter, "score.adapter")
        rows = []
        for i, it in enumerate(call.items):
            where = f"score.items[{i}]"
            check_tokens(it.tokens, m.vocab_size, f"{where}.response_tokens")
            prompt_ids = self.prompt(list(it.prompt_ids), where)
            self.check_length(len(prompt_ids), int(it.tokens.size), where)
            rows.append(Row(prompt_ids, it.temperature, forced=it.tokens, vocab_steps=list(it.vocab_steps)))
        with self.active(key):
            results = self.run_batch(rows)
        outputs = []
        for it, res in zip(call.items, results, strict=True):
            vocab = (np.stack(res.vocab).astype(np.float32) if res.vocab
                     else np.zeros((0, m.vocab_size), dtype=np.float32))
            outputs.append(ScoreOutput(it.item_id, _f32(res.logprobs), vocab))
        return ScoreResult(outputs, m.model_digest, self._digest(key))

    def _digest(self, key: str | None) -> str | None:
        m = self.loaded("call")
        return None if key is None else m.adapters[key].digest

    # -- the learner ------------------------------------------------------------------------------------------

    def _train(self, adapter: Adapter) -> None:
        """Make the installed `adapter` the one under training (peft's parameters); a new optimizer state."""
        params, names = [], []
        for module in sorted(adapter.weights):
            a, b = adapter.weights[module]
            params += [a, b]
            names += [f"{PEFT_PREFIX}{module}.lora_A.weight", f"{PEFT_PREFIX}{module}.lora_B.weight"]
        self.trainer = Trainer(adapter, params, names)

    def _restore(self, moments: dict[str, Any], steps: int) -> None:
        """AdamW continuing from a checkpoint: its moments for every parameter and its step count."""
        trainer = self.trainer
        assert trainer is not None
        trainer.optimizer = torch.optim.AdamW(trainer.params)
        for param, name in zip(trainer.params, trainer.names, strict=True):
            trainer.optimizer.state[param] = {
                "step": torch.tensor(float(steps), dtype=torch.float32),
                "exp_avg": moments[f"{name}.exp_avg"].to(param.device).clone(),
                "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(param.device).clone()}
        trainer.steps = steps

    def _fresh(self, lora: LoraParams, seed: int) -> None:
        """A new adapter with PEFT's default init: A kaiming-uniform from a generator seeded by `seed`, B zero."""
        m = self.loaded("learner_step")
        names = _target_names(m.model, lora.target_modules)
        if not names:
            raise MethodError(f"learner_step.lora.target_modules: {lora.target_modules} match no linear layer of "
                              "the model; name projections such as q_proj, v_proj")
        g = torch.Generator().manual_seed(seed)
        modules = dict(m.model.named_modules())
        weights = {}
        for name in names:
            module = modules[name]
            a = torch.empty((lora.r, module.in_features), dtype=torch.float32)
            torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=g)
            weights[name] = (a, torch.zeros((module.out_features, lora.r), dtype=torch.float32))
        adapter = Adapter(weights, lora.r, lora.alpha, sorted(lora.target_modules), None)
        self._install(LOADED, adapter)  # peft's own init is overwritten by this seeded one
        self._train(adapter)

    def learner_step(self, step: LearnerStepParams) -> LearnerStepResult:
        m = self.loaded("learner_step")
        rows: list[tuple[list[int], Any]] = []
        for i, s in enumerate(step.samples):
            where = f"learner_step.samples[{i}]"
            check_tokens(s.tokens, m.vocab_size, f"{where}.tokens")
            prompt_ids = self.prompt(list(s.prompt_ids), where)
            self.check_length(len(prompt_ids), int(s.tokens.size), where)
            rows.append((prompt_ids, s.tokens.astype(np.int64)))
        if step.objective.kl_coef != 0 and any(s.reference_logprobs is None for s in step.samples):
            raise MethodError("learner_step: objective.kl_coef is not 0, so every sample needs reference_logprobs")
        save_dir = Path(step.save_dir)
        if save_dir.exists() and (not save_dir.is_dir() or any(save_dir.iterdir())):
            raise MethodError(f"learner_step.save_dir: {step.save_dir!r} exists and is not an empty folder; "
                              "name a new folder for the updated adapter")
        if self.trainer is None:
            if step.lora is None:
                raise MethodError("learner_step.lora: no adapter is loaded, so send lora settings for a fresh one")
            self._fresh(step.lora, step.seed)
        trainer = self.trainer
        assert trainer is not None
        if step.lora is not None and (step.lora.r, step.lora.alpha, sorted(step.lora.target_modules)) != (
                trainer.adapter.r, trainer.adapter.alpha, trainer.adapter.target_modules):
            raise MethodError(
                f"learner_step.lora: the adapter under training has r={trainer.adapter.r}, "
                f"alpha={trainer.adapter.alpha:g}, target_modules={trainer.adapter.target_modules}; lora settings "
                "only shape a fresh adapter: send the same ones or none")
        start_digest = trainer.adapter.digest

        # Absent: the whole batch in one padded forward and one backward (the learner's behaviour before schedules
        # existed).
        schedule = None if step.schedule is None else step.schedule.split(len(rows))
        opt = step.optimizer
        if trainer.optimizer is None:
            trainer.optimizer = torch.optim.AdamW(trainer.params, lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                                  weight_decay=opt.weight_decay)
        for group in trainer.optimizer.param_groups:
            group.update(lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
        trainer.optimizer.zero_grad(set_to_none=True)
        if schedule is None:
            with self.active(LOADED):
                current = self._teacher_forced(rows, step.temperature)
            terms = _objective(current, step)
            terms.pop("graph").backward()
        else:
            current, terms = self._scheduled_gradients(rows, step, *schedule)
        if any(p.grad is None for p in trainer.params):
            raise RuntimeError("learner_step: no gradient reached the adapter's weights; the engine's forward is not "
                               "differentiable on this configuration")
        if opt.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(trainer.params, opt.max_grad_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in trainer.params])
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.steps += 1

        assert m.peft is not None
        from peft import get_peft_model_state_dict

        state = {k: v.detach().to("cpu").contiguous()
                 for k, v in get_peft_model_state_dict(m.peft, adapter_name=trainer.adapter.key).items()}
        if sorted(state) != sorted(trainer.names):
            raise RuntimeError(f"peft's state dict names {sorted(state)[:2]}…, not the adapter's tensors")
        moments = {f"{name}.{moment}": trainer.optimizer.state[p][moment].detach().to("cpu").contiguous()
                   for p, name in zip(trainer.params, trainer.names, strict=True) for moment in MOMENTS}
        save_atomically(save_dir, lambda tmp: _write_checkpoint(tmp, state, moments, trainer.adapter,
                                                                m.model_digest), optimizer_steps=trainer.steps)
        tensors = {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                   for k, v in state.items()}
        digest = trainer.adapter.digest = canonical.tree_digest(str(save_dir))
        return LearnerStepResult(
            proximal_logprobs=[c.detach().cpu().numpy().astype(np.float32) for c in current],
            loss=terms["loss"], policy=terms["policy"], kl=terms["kl"],
            importance_weight_mean=terms["importance_weight_mean"], tokens=terms["tokens"],
            grad_norm=float(grad_norm), adapter_dir=str(save_dir), adapter_digest=digest, adapter_tensors=tensors,
            start_adapter_digest=start_digest, optimizer_steps=trainer.steps, model_digest=m.model_digest,
            packed=step.packed,  # answered in the layout the call came in
        )

    def _scheduled_gradients(self, rows: list[tuple[list[int], Any]], step: LearnerStepParams, micro_batch: int,
                             reduction: str) -> tuple[list[Any], dict[str, Any]]:
        """The gradient of the batch's loss, in micro-batches of `micro_batch` sequences, left in `.grad`.

        `float64-sequence`: each sequence is scored alone (a batch of one: the HF forward is not batch-invariant)
        and its gradient summed in float64 in sequence order, then rounded once, so the split does not change a
        bit. `float32-microbatch` (the negative control): one padded forward and backward per micro-batch, its
        float32 gradient added to `.grad` in micro-batch order."""
        trainer = self.trainer
        assert trainer is not None
        n = sum(int(s.tokens.size) for s in step.samples)
        current: list[Any] = []
        total: list[Any] | None = None
        for first in range(0, len(rows), micro_batch):
            chunk = list(range(first, min(first + micro_batch, len(rows))))
            if reduction == "float64-sequence":
                for i in chunk:
                    with self.active(LOADED):
                        scored = self._teacher_forced([rows[i]], step.temperature)
                    loss = _objective(scored, step, samples=[step.samples[i]], n=n)["graph"]
                    grads = torch.autograd.grad(loss, trainer.params)
                    total = [g.double() for g in grads] if total is None else \
                        [t + g.double() for t, g in zip(total, grads, strict=True)]
                    current.extend(c.detach() for c in scored)
            else:
                with self.active(LOADED):
                    scored = self._teacher_forced([rows[i] for i in chunk], step.temperature)
                _objective(scored, step, samples=[step.samples[i] for i in chunk], n=n)["graph"].backward()
                current.extend(c.detach() for c in scored)
        if total is not None:
            for p, t in zip(trainer.params, total, strict=True):
                p.grad = t.float()
        terms = _objective(current, step)
        terms.pop("graph")
        return current, terms

    def _teacher_forced(self, rows: list[tuple[list[int], Any]], temperature: float,
                        budget: int = LOGITS_BUDGET) -> list[Any]:
        """One forward over [prompt, response] (right padded) with autograd: log p(token_t) at T, float32 [T_i].

        While the whole batch's float32 logits, rows × width × vocabulary, fit in `budget` bytes, the model's own
        forward gives them and each row's response slice is log-softmaxed (the learner's path before the bound).
        Past it, `_bounded_logprobs` keeps at most about `budget` bytes of [positions, vocabulary] alive."""
        m = self.loaded("learner_step")
        seqs = [p + [int(t) for t in toks] for p, toks in rows]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), m.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        positions = torch.arange(width)[None, :].expand(len(seqs), width)
        inputs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device),
                  "position_ids": positions.to(self.device)}
        if len(seqs) * width * m.vocab_size * 4 > budget and self._plain_head(inputs):
            return self._bounded_logprobs(inputs, rows, temperature, budget)
        logits = m.model(**inputs).logits.float()
        out = []
        for i, (prompt, toks) in enumerate(rows):
            # Position t predicts token t + 1: the response's logits start at the prompt's last position.
            lp = torch.log_softmax(logits[i, len(prompt) - 1 : len(prompt) - 1 + len(toks)] / temperature, dim=-1)
            target = torch.as_tensor(np.asarray(toks, dtype=np.int64), device=self.device)
            out.append(lp.gather(-1, target[:, None])[:, 0])
        return out

    def _plain_head(self, inputs: dict[str, Any]) -> bool:
        """Whether the model's logits are its output projection of its decoder's last hidden states and nothing
        more (no soft-capping or scaling in its forward), checked once per loaded model, bit for bit, on the
        batch's first row's first tokens: only then may `_bounded_logprobs` apply the projection itself."""
        m = self.loaded("learner_step")
        if m.plain_head is None:
            decoder, head = m.model.get_decoder(), m.model.get_output_embeddings()
            probe = {k: v[:1, :8] for k, v in inputs.items()}
            with torch.no_grad():
                whole = m.model(**probe).logits
                m.plain_head = (head is not None and decoder is not m.model
                                and torch.equal(head(decoder(**probe, use_cache=False).last_hidden_state), whole))
        return m.plain_head

    def _bounded_logprobs(self, inputs: dict[str, Any], rows: list[tuple[list[int], Any]], temperature: float,
                          budget: int) -> list[Any]:
        """`_teacher_forced`'s values without the whole batch's activations and logits: the decoder's hidden
        states with each layer recomputed in backward (`_recomputed_layers`), then the output projection and
        log-softmax only at the response positions (the prompt's last position onward), in chunks of about
        `budget` bytes of float32 [positions, vocabulary], each recomputed in backward (`torch.utils.checkpoint`),
        so one chunk's logits are alive at a time. Every row is computed by the same operations as in the model's
        own forward; whether the CPU's matrix product rounds a chunk's rows as it rounds them inside the whole
        batch's product is measured, not promised (bit-identical on the shipped model and on SmolLM2-135M at the
        default budget once every chunk is projected as at least `HEAD_ROWS` rows: docs/training.md)."""
        m = self.loaded("learner_step")
        decoder = m.model.get_decoder()
        with _recomputed_layers(decoder):
            hidden = decoder(**inputs, use_cache=False).last_hidden_state
        width = hidden.shape[1]
        at = torch.cat([torch.arange(len(p) - 1, len(p) - 1 + len(t)) + i * width for i, (p, t) in enumerate(rows)])
        states = hidden.reshape(-1, hidden.shape[-1]).index_select(0, at.to(self.device))
        targets = torch.as_tensor(np.concatenate([np.asarray(t, dtype=np.int64) for _, t in rows]),
                                  device=self.device)
        head = m.model.get_output_embeddings()
        # Equal chunks (sizes differ by at most one), so no chunk is a short tail; each is projected as at least
        # HEAD_ROWS rows, where the CPU matrix product rounds a row as it does inside the whole batch's product.
        n = len(targets)
        chunks = -(-n // max(HEAD_ROWS, budget // (4 * m.vocab_size)))
        bounds = [n * c // chunks for c in range(chunks + 1)]
        parts = [torch.utils.checkpoint.checkpoint(_sampled_logprobs, head, states[a:b], targets[a:b], temperature,
                                                   use_reentrant=False)
                 for a, b in itertools.pairwise(bounds)]
        return list(torch.split(torch.cat(parts), [len(t) for _, t in rows]))


@contextlib.contextmanager
def _recomputed_layers(decoder: Any) -> Iterator[None]:
    """Within: each decoder layer keeps only its input for backward and recomputes its activations there
    (transformers' per-layer checkpointing, non-reentrant). transformers checkpoints a layer whose own `training`
    flag is set; only that flag is set, so the layer's modules (attention, dropout, LoRA) still run in eval mode
    and compute what they compute without it. Recomputation on a deterministic engine repeats the same operations,
    so values and gradients keep their bits (tests/workers/hf/test_hf_bounded_logprobs.py)."""
    layers = [mod for mod in decoder.modules() if isinstance(mod, GradientCheckpointingLayer)]
    saved = [(layer.training, layer.__dict__.get("gradient_checkpointing"),
              layer.__dict__.get("_gradient_checkpointing_func")) for layer in layers]
    recompute = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    for layer in layers:
        layer.training = True
        layer.gradient_checkpointing = True
        setattr(layer, "_gradient_checkpointing_func", recompute)  # noqa: B010  # torch types the attribute a Module
    try:
        yield
    finally:
        for layer, (training, flag, func) in zip(layers, saved, strict=True):
            layer.training = training
            for name, value in (("gradient_checkpointing", flag), ("_gradient_checkpointing_func", func)):
                if value is None:
                    layer.__dict__.pop(name, None)
                else:
                    setattr(layer, name, value)


def _sampled_logprobs(head: Any, states: Any, targets: Any, temperature: float) -> Any:
    """log_softmax(head(states) / T) at each target, float32 [positions]: the learner's per-row formula, the
    projection taken over at least `HEAD_ROWS` rows (zero rows appended, their logits dropped before the softmax)."""
    short = HEAD_ROWS - states.shape[0]
    rows = torch.cat([states, states.new_zeros(short, states.shape[-1])]) if short > 0 else states
    lp = torch.log_softmax(head(rows)[: states.shape[0]].float() / temperature, dim=-1)
    return lp.gather(-1, targets[:, None])[:, 0]


def _read_moments(folder: Path, adapter: Adapter) -> tuple[dict[str, Any], int]:
    """AdamW's moments saved with a checkpoint and its step count (from the manifest); a folder without them is
    refused, since there is no state to resume."""
    where = "load_model.adapter.resume"
    try:
        steps = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["optimizer_steps"]
        moments = load_file(str(folder / OPTIMIZER_WEIGHTS))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise MethodError(f"{where}: {folder} holds no readable optimizer state ({type(exc).__name__}: {exc}); "
                          "resume from a training checkpoint, which keeps its manifest and optimizer.safetensors")\
            from None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise MethodError(f"{where}: {folder / MANIFEST} records optimizer_steps {steps!r}; expected an integer ≥ 1")
    for module in adapter.weights:
        for which in ("A", "B"):
            for moment in MOMENTS:
                name = f"{PEFT_PREFIX}{module}.lora_{which}.weight.{moment}"
                if name not in moments or moments[name].dtype != torch.float32:
                    raise MethodError(f"{where}: {folder / OPTIMIZER_WEIGHTS} lacks float32 {name}; the optimizer "
                                      "state is not this adapter's")
    return moments, steps


class NonFiniteOutput(RuntimeError):
    """The model's forward gave NaN: no token can be drawn and no log-probability reported (a patch or kernel that
    computes NaN, an overflow in a lower precision). The call is answered with this error, named by its type."""


def _check_finite(lp: np.ndarray, done: list[bool], step: int) -> None:
    """Refuse a step whose log-probabilities (float32 [rows, vocab]) hold NaN in a row still decoding. -inf is a
    masked token's log-probability, NaN never is; argmax and sampling would turn it into a token without a word."""
    if not np.isnan(lp).any():
        return
    rows = [i for i in range(len(done)) if not done[i] and np.isnan(lp[i]).any()]
    if rows:
        raise NonFiniteOutput(f"the model's log-probabilities hold NaN at response step {step} in {len(rows)} of "
                              f"{len(done)} rows of the batch (first: row {rows[0]}); the forward computed a "
                              "non-finite value, so no token was drawn")


def _draw(lp: Any, top_p: float, generator: Any) -> int:
    """One token from exp(lp), truncated to the smallest set of most likely tokens whose mass reaches top_p."""
    probs = lp.exp()
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True, stable=True)
        keep = (torch.cumsum(ordered, 0) - ordered) < top_p
        probs = torch.zeros_like(probs).index_put_((order[keep],), ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def _f32(values: list[Any]) -> np.ndarray:
    """float32 [T] from the loop's per-token values (numpy float32 scalars)."""
    return np.asarray(values, dtype=np.float32).reshape(-1)


REDUCTIONS = ("float64-sequence", "float32-microbatch")
"""The `learner_step.schedule` reductions this learner computes."""


def read_learner_step(params: Any) -> LearnerStepParams:
    """A `learner_step` call's params as this learner reads them: a schedule only with a reduction it computes."""
    return LearnerStepParams.from_wire(params, reductions=REDUCTIONS)


def _objective(current: list[Any], step: LearnerStepParams, *, samples: Sequence[LearnerSample] | None = None,
               n: int | None = None) -> dict[str, Any]:
    """invar.loop.objective's loss, per token in float32, at current = proximal (the update's first step).

    current: one float32 tensor [T_i] per sample (of `samples`, default the step's), with autograd. Returns the
    reported terms (float64 sums of the float32 per-token values, divided by N, as the core computes them) and,
    under "graph", the float32 loss the gradient is taken of. `n`: the batch's token count N when `samples` is a
    part of it (a micro-batch's loss is its share of the batch's token mean).
    """
    o = step.objective
    lo = float(np.float32(1.0 - o.clip_low))
    hi = float(np.float32(1.0 + o.clip_high))
    policy_terms, kl_terms, weights = [], [], []
    for c, s in zip(current, step.samples if samples is None else samples, strict=True):
        proximal = c.detach()
        behavior = torch.as_tensor(s.behavior_logprobs, device=c.device)
        a = torch.tensor(float(np.float32(s.advantage)), dtype=torch.float32, device=c.device)
        w = torch.exp(proximal - behavior)  # the importance weight: FP32, exactly 1 where the two are equal
        if o.importance_cap is not None:
            cap = torch.tensor(float(np.float32(o.importance_cap)), dtype=torch.float32, device=c.device)
            w = torch.minimum(w, cap) if o.importance == "truncate" else torch.where(w > cap, torch.zeros_like(w), w)
        r = torch.exp(c - proximal)  # the policy ratio: its value is exactly 1 here, its gradient is not 0
        surrogate = torch.minimum(r * a, torch.clamp(r, lo, hi) * a)
        policy_terms.append(-(w * surrogate))
        weights.append(w)
        if s.reference_logprobs is not None and o.kl_coef != 0:
            d = torch.as_tensor(s.reference_logprobs, device=c.device) - c
            kl_terms.append(torch.expm1(d) - d)  # k3 as the core has it: no cancellation from size 1
    if n is None:
        n = sum(int(t.numel()) for t in policy_terms)
    policy_all = torch.cat(policy_terms)
    graph = policy_all.sum() / n
    kl = 0.0
    if kl_terms:
        kl_all = torch.cat(kl_terms)
        graph = graph + o.kl_coef * (kl_all.sum() / n)
        kl = float(np.sum(kl_all.detach().cpu().numpy(), dtype=np.float64)) / n
    policy = float(np.sum(policy_all.detach().cpu().numpy(), dtype=np.float64)) / n
    w_mean = float(np.sum(torch.cat(weights).cpu().numpy(), dtype=np.float64)) / n
    return {"loss": policy + o.kl_coef * kl, "policy": policy, "kl": kl, "importance_weight_mean": w_mean,
            "tokens": n, "graph": graph}


# -- process --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.hf_worker")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.INFERENCE.value)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (fixed: numerics follow it)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, or cuda where one is present")
    parser.add_argument("--attn-implementation", choices=["sdpa", "eager"], default=None,
                        help="transformers' attention: sdpa (the fused kernel) or eager (matmul and softmax); "
                             "default sdpa, eager under a patch or a softmax kernel")
    add_patch_arguments(parser)
    add_channel_argument(parser)
    args = parser.parse_args(argv)
    try:
        patches = load_patches(args.patch, args.patch_poison, args.patch_dir)
        patches.apply("hf")  # before any model is loaded
        attn_implementation = patches.attention(args.attn_implementation)
    except PatchRefused as exc:
        print(f"invar.workers.hf_worker: {exc}", file=sys.stderr, flush=True)
        return 2
    # Deterministic cuBLAS needs its workspace fixed before the first CUDA matrix product.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves them unannotated
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]

    def server_for(role: Role) -> Server:
        engine = Engine(role, args.device)
        engine.attn_implementation = attn_implementation
        methods = {LOAD_MODEL.name: serves(LOAD_MODEL, engine.load_model),
                   LOAD_ADAPTER.name: serves(LOAD_ADAPTER, engine.load_adapter),
                   SCORE.name: patches.counted(serves(SCORE, engine.score))}
        if role == Role.INFERENCE:
            methods[GENERATE.name] = patches.counted(serves(GENERATE, engine.generate))
        else:
            methods[LEARNER_STEP.name] = serves(LEARNER_STEP, engine.learner_step, read=read_learner_step)
        return Server(
            engine="hf",
            engine_version={"invar": __version__, **versions("torch", "transformers", "bitsandbytes",
                                                            "safetensors", "tokenizers")},
            role=role,
            settings={"device": args.device, "threads": args.threads, "interop_threads": 1,
                      "deterministic_algorithms": True, "attn_implementation": attn_implementation,
                      **patches.settings()},
            methods=methods,
        )

    return serve_roles(parser, server_for, Role(args.role), args.learner_channel)

if __name__ == "__main__":
    exit_worker(main())
