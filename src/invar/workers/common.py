"""What every engine worker checks the same way: prompt ids against the model, model and adapter digests, patches.

The engines differ in how they run a model; they must not differ in what a request means. Every worker parses its
params through the structs of `invar.protocol.payloads`, so a malformed request gets the same message from each
engine, and builds its results with them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.formats.checkpoint import ADAPTER_CONFIG, BASE_DIGEST_KEY, PEFT_WEIGHTS
from invar.protocol import MethodError


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
    is returned as is, so the engine's own values pass through untouched. The endpoint worker's: a server returns
    temperature-1 values only.
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
    from invar.formats.tokenizer import ModelTokenizer

    try:
        return frozenset(ModelTokenizer.from_model_dir(model_dir).eos_token_ids)
    except InvarError as exc:
        raise MethodError(f"load_model: {exc}") from None


# -- PEFT LoRA adapters: what every engine checks before it reads the weights --------------------------------------

# The names are the core's, which checks every learner's adapter before it is published.
ADAPTER_WEIGHTS = PEFT_WEIGHTS


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


# -- candidate patches and kernels (a name under patches/ or a folder anywhere; the digest rule is invar.patches') --


def add_patch_arguments(parser: argparse.ArgumentParser) -> None:
    """`--patch REFERENCE=SHA256` and `--patch-dir REFERENCE=FOLDER` (repeatable), and the tests' poison switch
    `--patch-poison REFERENCE`."""
    parser.add_argument("--patch", action="append", default=[], metavar="REFERENCE=SHA256",
                        help="apply a patch or function kernel before any model loads: a name under patches/ or a "
                             "folder path; refuse to start unless its digest (invar.patches.patch_digest) is SHA256")
    parser.add_argument("--patch-dir", action="append", default=[], metavar="REFERENCE=FOLDER",
                        help="where the folder of --patch REFERENCE lies (a contract's path, resolved by the core); "
                             "default: the reference itself")
    parser.add_argument("--patch-poison", action="append", default=[], metavar="REFERENCE",
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

    def _ops(self) -> set[str]:
        """The ops of the function kernels among the patches."""
        return {m.spec.op for m in self.modules.values() if hasattr(m, "spec")}

    def attention(self, asked: str | None) -> str:
        """The HF attention implementation to run with, given `--attn-implementation` (None: not given).

        A `patch.py` patch and a softmax kernel need eager attention (SDPA's fused kernel would bypass the patched
        products and softmax); an attention kernel needs SDPA (the op it replaces); any other kernel keeps the
        default, SDPA, so a kernel candidate differs from the stock reference in the kernel alone."""
        eager = any(not hasattr(m, "spec") for m in self.modules.values()) or "softmax" in self._ops()
        if "attention" in self._ops():
            if eager or asked == "eager":
                raise PatchRefused("an attention kernel replaces SDPA, which eager attention (asked for, or needed "
                                   "by a patch or softmax kernel applied with it) never calls; leave "
                                   "--attn-implementation out and apply it alone")
            return "sdpa"
        if any(not hasattr(m, "spec") for m in self.modules.values()) and asked == "sdpa":
            raise PatchRefused("--attn-implementation sdpa cannot run under a patch (SDPA's fused kernel would bypass "
                               "the patched matmul and softmax); leave it out or pass eager")
        return asked or ("eager" if eager else "sdpa")

    def settings(self) -> dict[str, Any]:
        """What the identity's settings gain: nothing without patches, so unpatched identities are unchanged."""
        if not self.modules:
            return {}
        out: dict[str, Any] = {"patches": dict(self.digests)}
        if self.poison:
            out["patch_poison"] = sorted(self.poison)
        return out

    def apply(self, engine: str) -> None:
        """Install every patch in this process, before any model is loaded (a kernel is self-checked first)."""
        from invar.workers.kernel_host import KernelRefused

        for name, module in self.modules.items():
            try:
                module.apply(engine, poison=name in self.poison)
            except KernelRefused as exc:
                raise PatchRefused(f"--patch {name}: {exc}") from None
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise PatchRefused(f"--patch {name}: cannot be applied to the {engine} engine "
                                   f"({type(exc).__name__}: {first})") from exc

    def counted(self, method: Any) -> Any:
        """`method`, reporting `patch_calls` {name: replaced-op invocations during the call}; unchanged without
        patches. A function kernel that did not run during the call makes the call an error: the evidence would not
        be of the kernel."""
        if not self.modules:
            return method

        def run(params: Any) -> Any:
            for module in self.modules.values():
                module.reset_calls()
            result = method(params)
            for module in self.modules.values():
                if hasattr(module, "never_called") and module.calls() == 0:
                    raise RuntimeError(module.never_called())
            return {**result, "patch_calls": {name: int(m.calls()) for name, m in self.modules.items()}}

        return run


def _folders(specs: list[str]) -> dict[str, Path]:
    folders: dict[str, Path] = {}
    for spec in specs:
        reference, sep, folder = spec.partition("=")
        if not sep or not reference or not folder:
            raise PatchRefused(f"--patch-dir {spec!r}: expected REFERENCE=FOLDER")
        folders[reference] = Path(folder)
    return folders


def load_patches(specs: list[str], poison: list[str], dirs: list[str] | None = None) -> Patches:
    """Check every `REFERENCE=SHA256` against the folder's digest, then import the patches and kernels (nothing is
    applied yet). `dirs`: `REFERENCE=FOLDER`, where a reference's folder lies when it is not the reference itself.

    The digest is checked before the patch's code is imported, so code other than the named one never runs.
    """
    from invar.errors import InvarError
    from invar.patches import patch_digest, patch_dir, read_kernel
    from invar.workers.kernel_host import FunctionKernel, KernelRefused

    given = _folders(dirs or [])
    digests: dict[str, str] = {}
    folders: dict[str, Path] = {}
    for spec in specs:
        name, sep, expected = spec.rpartition("=")
        if not sep or not name or _SHA256.fullmatch(expected) is None:
            raise PatchRefused(f"--patch {spec!r}: expected REFERENCE=SHA256 (a patch name or folder, and its "
                               "digest in lowercase hex)")
        if name in digests:
            raise PatchRefused(f"--patch {name}: given twice; name each patch once")
        try:
            folder = given[name] if name in given else patch_dir(name)
            actual = patch_digest(folder)
        except InvarError as exc:
            raise PatchRefused(f"--patch {name}: {exc}") from None
        if actual != expected:
            raise PatchRefused(f"--patch {name}: the folder {folder} has digest {actual}, but {expected} was asked "
                               "for: the patch's files differ from the ones named; pass the digest of the patch "
                               "you mean to run (invar.patches.patch_digest)")
        digests[name] = actual
        folders[name] = folder
    unknown = sorted(set(poison) - set(digests))
    if unknown:
        raise PatchRefused(f"--patch-poison {', '.join(unknown)}: not among the --patch arguments; poison only a "
                           "patch the worker applies")
    modules: dict[str, Any] = {}
    taken: dict[str, str] = {}
    for name in digests:
        try:
            kernel = read_kernel(folders[name])
            module = FunctionKernel(name, folders[name], kernel) if kernel is not None else \
                _import_patch(name, folders[name])
        except (InvarError, KernelRefused) as exc:
            raise PatchRefused(f"--patch {name}: {exc}") from None
        for op in sorted(module.REPLACES):
            if op in taken:
                raise PatchRefused(f"--patch {name}: it replaces {op}, as --patch {taken[op]} does; apply one of "
                                   "them")
            taken[op] = name
        modules[name] = module
    return Patches(modules, digests, sorted(set(poison)))


def _import_patch(name: str, folder: Path) -> Any:
    """The folder's `patch.py`, imported (the plug-in API of patches/README.md)."""
    code = folder / "patch.py"
    stem = name if "/" not in name and os.sep not in name else f"{folder.name}_{abs(hash(str(folder)))}"
    found = importlib.util.spec_from_file_location(f"invar_patch_{re.sub(r'[^0-9A-Za-z_]', '_', stem)}", code)
    if not code.is_file() or found is None or found.loader is None:
        raise PatchRefused(f"--patch {name}: {code} is missing; a patch folder holds its code in patch.py, or a "
                           "function kernel in kernel.py with kernel.toml")
    module = importlib.util.module_from_spec(found)
    try:
        found.loader.exec_module(module)
    except SyntaxError as exc:
        raise PatchRefused(f"--patch {name}: {code}: syntax error at line {exc.lineno} ({exc.msg}); fix it") from None
    return module
