"""What every engine worker checks the same way: the learner's request schema, model and adapter digests, patches.

The engines differ in how they run a model; they must not differ in what a request means. Every worker parses its
params through the structs of `invar.protocol.payloads` (and the learner's through `parse_learner_step` here), so a
malformed request gets the same message from each engine, and builds its results with them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from invar import canonical
from invar.loop.checkpoint import ADAPTER_CONFIG, BASE_DIGEST_KEY, PEFT_WEIGHTS
from invar.protocol import MethodError
from invar.protocol.payloads import prompt_ids as parse_prompt_ids


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of the named packages (the engine part of a worker's identity)."""
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def verify_dir(path: str, digest: str | None, what: str) -> str:
    """Check that `path` is a folder whose tree digest is `digest` (if given); returns the digest."""
    if not os.path.isdir(path):
        raise MethodError(f"{what} folder {path!r} does not exist; pass the folder that holds it")
    actual = canonical.tree_digest(path)
    if digest is not None and actual != digest:
        raise MethodError(f"{what} folder {path!r} has digest {actual[:16]}…, expected {digest[:16]}…: "
                          "the files differ from the ones the call names")
    return actual


def check_tokens(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise MethodError(f"{where}: token ids must be in [0, {vocab_size})")


def check_prompt_ids(ids: list[int], vocab_size: int, where: str) -> None:
    """Prompt ids must name tokens of the loaded model: ids of another tokenizer are refused, not run."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise MethodError(f"{where}.prompt_ids: token id {bad} is outside the model's vocabulary [0, {vocab_size}); "
                          "tokenize the prompt with this model's tokenizer")


def at_temperature(logprobs_t1: np.ndarray, temperature: float) -> np.ndarray:
    """log_softmax(l / T) of temperature-1 log-probabilities `l` ([..., V] float32, nats) → [..., V] float32.

    Equal to log_softmax(logits / T) in exact arithmetic; computed in float64 and rounded once. At T = 1 the input
    is returned as is, so the engine's own values pass through untouched. One definition for the vLLM and endpoint
    workers: the same server values must rescale to the same bits in both.
    """
    if temperature == 1.0:
        return logprobs_t1.astype(np.float32)
    z = logprobs_t1.astype(np.float64) / temperature
    top = np.max(z, axis=-1, keepdims=True)
    out: np.ndarray = (z - (top + np.log(np.sum(np.exp(z - top), axis=-1, keepdims=True)))).astype(np.float32)
    return out


def response_end_ids(model_dir: str) -> frozenset[int]:
    """The ids that end a response, resolved exactly as the core resolves them (`ModelTokenizer.eos_token_ids`:
    `generation_config.json`'s eos_token_id, else `config.json`'s, else `tokenizer_config.json`'s eos_token).

    The core checks every `stop` against this set, so a worker must stop at each of its ids and at no other: a
    model whose `generation_config.json` names more ids than `config.json` (Qwen2.5, Llama-3) would otherwise run
    past an end. A folder that names none is a `MethodError`.
    """
    from invar.errors import InvarError
    from invar.tasks import ModelTokenizer

    try:
        return frozenset(ModelTokenizer.from_model_dir(model_dir).eos_token_ids)
    except InvarError as exc:
        raise MethodError(f"load_model: {exc}") from None


# -- learner_step params (docs/objective.md): the same schema for every learner ------------------------------


@dataclass(frozen=True)
class Sample:
    prompt_ids: list[int]
    tokens: np.ndarray
    behavior: np.ndarray
    advantage: float
    reference: np.ndarray | None


@dataclass(frozen=True)
class ObjectiveParams:
    clip_low: float
    clip_high: float
    kl_coef: float
    importance: str = "none"
    """`none`, `truncate` (w ← min(w, cap)) or `mask` (w ← 0 where w > cap): `invar.loop.objective`."""
    importance_cap: float | None = None


@dataclass(frozen=True)
class OptimizerParams:
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    max_grad_norm: float | None


@dataclass(frozen=True)
class LoraSettings:
    r: int
    alpha: float
    target_modules: list[str]


@dataclass(frozen=True)
class LearnerStep:
    samples: list[Sample]
    temperature: float
    objective: ObjectiveParams
    optimizer: OptimizerParams
    lora: LoraSettings | None
    seed: int
    save_dir: str


def _num(m: dict[str, Any], name: str, where: str, *, default: float | None = None) -> float:
    value = m.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MethodError(f"{where}.{name}: expected a finite number")
    return float(value)


def _map(m: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = m.get(name)
    if not isinstance(value, dict):
        raise MethodError(f"{where}.{name}: expected a map")
    return value


def _logprob_array(value: Any, length: int, where: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.shape != (length,):
        raise MethodError(f"{where}: expected a float32 array of {length} log-probabilities (one per token)")
    if not np.all(np.isfinite(value)) or np.any(value > 0):
        raise MethodError(f"{where}: log-probabilities must be finite and ≤ 0")
    return value


def parse_learner_step(params: dict[str, Any]) -> LearnerStep:
    """Validate `learner_step` params (docs/objective.md); every message names the field to change."""
    where = "learner_step"
    raw = params.get("samples")
    if not isinstance(raw, list) or not raw:
        raise MethodError(f"{where}.samples: expected a non-empty list of samples")
    samples = []
    for i, s in enumerate(raw):
        w = f"{where}.samples[{i}]"
        if not isinstance(s, dict):
            raise MethodError(f"{w}: expected a map with prompt_ids, tokens, behavior_logprobs, advantage")
        tokens = s.get("tokens")
        if (not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu"
                or not tokens.size):
            raise MethodError(f"{w}.tokens: expected a non-empty 1-D integer array")
        ref = s.get("reference_logprobs")
        samples.append(Sample(
            prompt_ids=parse_prompt_ids(s, w), tokens=tokens.astype(np.int64),
            behavior=_logprob_array(s.get("behavior_logprobs"), tokens.size, f"{w}.behavior_logprobs"),
            advantage=_num(s, "advantage", w),
            reference=None if ref is None else _logprob_array(ref, tokens.size, f"{w}.reference_logprobs")))
    temperature = _num(params, "temperature", where)
    if temperature <= 0:
        raise MethodError(f"{where}.temperature: must be > 0 (the rollout temperature the behavior was "
                          "drawn at)")
    o = _map(params, "objective", where)
    importance = o.get("importance", "none")
    if importance not in ("none", "truncate", "mask"):
        raise MethodError(f"{where}.objective.importance: {importance!r}; use none, truncate or mask")
    cap = o.get("importance_cap")
    if (importance == "none") != (cap is None):
        raise MethodError(f"{where}.objective.importance_cap: give a cap exactly when importance is truncate or "
                          "mask")
    objective = ObjectiveParams(_num(o, "clip_low", f"{where}.objective"),
                                _num(o, "clip_high", f"{where}.objective"),
                                _num(o, "kl_coef", f"{where}.objective", default=0.0), importance,
                                None if cap is None else _num(o, "importance_cap", f"{where}.objective"))
    if not 0 <= objective.clip_low < 1 or objective.clip_high < 0 or objective.kl_coef < 0:
        raise MethodError(f"{where}.objective: need 0 ≤ clip_low < 1, clip_high ≥ 0, kl_coef ≥ 0")
    if objective.importance_cap is not None and objective.importance_cap <= 1:
        raise MethodError(f"{where}.objective.importance_cap: must be above 1 (weights of 1 are never cut)")
    if objective.kl_coef != 0 and any(s.reference is None for s in samples):
        raise MethodError(f"{where}: objective.kl_coef is not 0, so every sample needs reference_logprobs")
    p = _map(params, "optimizer", where)
    betas = p.get("betas", [0.9, 0.999])
    if (not isinstance(betas, list) or len(betas) != 2
            or not all(isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        raise MethodError(f"{where}.optimizer.betas: expected two numbers in [0, 1)")
    mgn = p.get("max_grad_norm")
    optimizer = OptimizerParams(
        lr=_num(p, "lr", f"{where}.optimizer"), betas=(float(betas[0]), float(betas[1])),
        eps=_num(p, "eps", f"{where}.optimizer", default=1e-8),
        weight_decay=_num(p, "weight_decay", f"{where}.optimizer", default=0.0),
        max_grad_norm=None if mgn is None else _num(p, "max_grad_norm", f"{where}.optimizer"))
    if optimizer.lr <= 0 or optimizer.eps <= 0 or optimizer.weight_decay < 0 or (
            optimizer.max_grad_norm is not None and optimizer.max_grad_norm <= 0):
        raise MethodError(f"{where}.optimizer: need lr > 0, eps > 0, weight_decay ≥ 0, max_grad_norm > 0 "
                          "or null")
    lora = None
    if params.get("lora") is not None:
        lo = _map(params, "lora", where)
        r, targets = lo.get("r"), lo.get("target_modules")
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise MethodError(f"{where}.lora.r: expected an integer ≥ 1")
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            raise MethodError(f"{where}.lora.target_modules: expected a non-empty list of module names")
        if _num(lo, "dropout", f"{where}.lora", default=0.0) != 0:
            raise MethodError(f"{where}.lora.dropout: must be 0; dropout would make the first step's ratio "
                              "differ from 1 (current ≠ proximal)")
        alpha = _num(lo, "alpha", f"{where}.lora")
        if alpha <= 0:
            raise MethodError(f"{where}.lora.alpha: must be > 0")
        lora = LoraSettings(r, alpha, [str(t) for t in targets])
    seed = params.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise MethodError(f"{where}.seed: expected an integer in [0, 2**63)")
    save_dir = params.get("save_dir")
    if not isinstance(save_dir, str) or not save_dir:
        raise MethodError(f"{where}.save_dir: expected the folder to write the updated adapter to")
    return LearnerStep(samples, temperature, objective, optimizer, lora, seed, save_dir)


# -- PEFT LoRA adapters: what every engine checks before it reads the weights --------------------------------------

# The names are the core's, which checks every learner's adapter before it is published.
ADAPTER_WEIGHTS = PEFT_WEIGHTS


def parse_schedule(raw: Any, rows: int, reductions: tuple[str, ...]) -> tuple[int, str] | None:
    """`learner_step.schedule` (docs/training.md, "Reproducible schedules"): (sequences per micro-batch, reduction);
    None when absent, for the learner's own default."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"micro_batch", "reduction"}:
        raise MethodError("learner_step.schedule: expected a map with micro_batch (integer ≥ 1 or null) and "
                          f"reduction (one of {list(reductions)})")
    size, reduction = raw.get("micro_batch"), raw.get("reduction", "float64-sequence")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise MethodError(f"learner_step.schedule.micro_batch: {size!r}; expected an integer ≥ 1, or null for the "
                          "whole batch")
    if reduction not in reductions:
        raise MethodError(f"learner_step.schedule.reduction: {reduction!r}; choose one of {list(reductions)}")
    return (rows if size is None else min(size, rows)), str(reduction)


def read_lora_config(path: str, where: str, unsupported: tuple[str, ...]) -> tuple[dict[str, Any], str, str]:
    """Read a PEFT LoRA folder's config; refuse what is missing, corrupt or not plain LoRA.

    `unsupported`: config keys this engine cannot apply (a truthy value is refused). Returns the config and the
    paths of the config and weights files.
    """
    config_path = os.path.join(path, ADAPTER_CONFIG)
    weights_path = os.path.join(path, ADAPTER_WEIGHTS)
    if not os.path.isfile(config_path) or not os.path.isfile(weights_path):
        raise MethodError(f"{where}: adapter folder {path!r} must hold {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} "
                          "(a PEFT LoRA adapter saved with safetensors)")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MethodError(f"{where}: {config_path} is not valid JSON ({exc}); the adapter is corrupt") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise MethodError(f"{where}: {config_path} is not a LoRA adapter config (peft_type must be LORA)")
    refused = [k for k in unsupported if config.get(k)]
    if config.get("bias", "none") != "none":
        refused.append("bias")
    if refused:
        raise MethodError(f"{where}: adapter {path!r} uses {', '.join(refused)}, which this worker does not "
                          "apply; save a plain LoRA adapter")
    return config, config_path, weights_path


def check_trained_on(metadata: dict[str, str], model_digest: str, path: str, where: str) -> None:
    """Refuse an adapter whose weights name another base model than the one loaded."""
    trained_on = metadata.get(BASE_DIGEST_KEY)
    if trained_on is not None and trained_on != model_digest:
        raise MethodError(f"{where}: adapter {path!r} was trained on base model {trained_on[:16]}…, but the loaded "
                          f"model is {model_digest[:16]}…: load the adapter's own base model, or another adapter")


# -- candidate patches (patches/<name>/patch.py; the digest rule is invar.patches') --------------------------------


def add_patch_arguments(parser: argparse.ArgumentParser) -> None:
    """`--patch NAME=SHA256` (repeatable) and the tests' poison switch `--patch-poison NAME`."""
    parser.add_argument("--patch", action="append", default=[], metavar="NAME=SHA256",
                        help="apply the patch folder patches/NAME before any model loads; refuse to start unless "
                             "its digest (invar.patches.patch_digest) is SHA256")
    parser.add_argument("--patch-poison", action="append", default=[], metavar="NAME",
                        help="tests only: the named patch flips the last bit of its results (recorded in the "
                             "identity as patch_poison)")


class PatchRefused(Exception):
    """A `--patch` argument the worker will not start with; the message names the patch and what to change."""


_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass
class Patches:
    """The patches a worker runs with: verified, imported, and (after `apply`) installed in this process."""

    modules: dict[str, Any]
    digests: dict[str, str]
    poison: list[str]

    @property
    def active(self) -> bool:
        return bool(self.modules)

    def settings(self) -> dict[str, Any]:
        """What the identity's settings gain: nothing without patches, so unpatched identities are unchanged."""
        if not self.modules:
            return {}
        out: dict[str, Any] = {"patches": dict(self.digests)}
        if self.poison:
            out["patch_poison"] = sorted(self.poison)
        return out

    def apply(self, engine: str) -> None:
        """Install every patch in this process, before any model is loaded."""
        for name, module in self.modules.items():
            try:
                module.apply(engine, poison=name in self.poison)
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise PatchRefused(f"--patch {name}: cannot be applied to the {engine} engine "
                                   f"({type(exc).__name__}: {first})") from exc

    def counted(self, method: Any) -> Any:
        """`method`, reporting `patch_calls` {name: replaced-op invocations during the call}; unchanged without
        patches."""
        if not self.modules:
            return method

        def run(params: dict[str, Any]) -> dict[str, Any]:
            for module in self.modules.values():
                module.reset_calls()
            result: dict[str, Any] = method(params)
            return {**result, "patch_calls": {name: int(m.calls()) for name, m in self.modules.items()}}

        return run


def load_patches(specs: list[str], poison: list[str]) -> Patches:
    """Check every `NAME=SHA256` against the folder's digest, then import the patches (nothing is applied yet).

    The digest is checked before the patch's code is imported, so code other than the named one never runs.
    """
    from invar.errors import InvarError
    from invar.patches import patch_digest, patch_dir

    digests: dict[str, str] = {}
    for spec in specs:
        name, sep, expected = spec.partition("=")
        if not sep or not name or _SHA256.fullmatch(expected) is None:
            raise PatchRefused(f"--patch {spec!r}: expected NAME=SHA256 (the patch's digest in lowercase hex)")
        if name in digests:
            raise PatchRefused(f"--patch {name}: given twice; name each patch once")
        try:
            folder = patch_dir(name)
            actual = patch_digest(name)
        except InvarError as exc:
            raise PatchRefused(f"--patch {name}: {exc}") from None
        if actual != expected:
            raise PatchRefused(f"--patch {name}: the folder {folder} has digest {actual}, but {expected} was asked "
                               "for: the patch's files differ from the ones named; pass the digest of the patch "
                               "you mean to run (invar.patches.patch_digest)")
        digests[name] = actual
    unknown = sorted(set(poison) - set(digests))
    if unknown:
        raise PatchRefused(f"--patch-poison {', '.join(unknown)}: not among the --patch arguments; poison only a "
                           "patch the worker applies")
    modules: dict[str, Any] = {}
    taken: dict[str, str] = {}
    for name in digests:
        code = patch_dir(name) / "patch.py"
        found = importlib.util.spec_from_file_location(f"invar_patch_{name.replace('-', '_')}", code)
        if not code.is_file() or found is None or found.loader is None:
            raise PatchRefused(f"--patch {name}: {code} is missing; a patch folder holds its code in patch.py")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        for op in sorted(module.REPLACES):
            if op in taken:
                raise PatchRefused(f"--patch {name}: it replaces {op}, as --patch {taken[op]} does; apply one of "
                                   "them")
            taken[op] = name
        modules[name] = module
    return Patches(modules, digests, sorted(set(poison)))
