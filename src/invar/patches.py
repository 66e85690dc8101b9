"""Candidate patches and kernels: the folders a package runs with, where each is found, and the digest that pins it.

A package in a use contract names the patches it runs with (`patches: {reference: sha256}`), and a worker started
with `--patch REFERENCE=SHA256` recomputes the digest before it applies anything. Both sides use `patch_digest`, so
the admission covers exactly the code that produced the evidence.

A reference is either a **name**, a folder directly under `$INVAR_HOME/patches/` (the shipped patches), or a
**path** to a folder anywhere: a reference that holds a path separator or starts with `.` or `~`, or one that is
no patch name but is an existing folder. In a declaration or a contract a path is relative to that file (like
`model_dir`) and always holds a `/`, so it never reads as a name.

The digest is `invar.canonical.tree_digest`'s (sha256 of the canonical map {relative path: file sha256}), except
that `__pycache__` folders and `*.pyc` files are left out: importing a patch writes bytecode next to it, and the
digest must not move because the patch ran. Everything else in the folder counts (code, README, data), so editing
any file makes a new candidate.

A folder holds either a patch (`patch.py`, the plug-in API of `patches/README.md`) or a function kernel
(`kernel.py` + `kernel.toml`, docs/kernels.md); `read_kernel` reads and checks the latter's `kernel.toml` here, so
the core refuses an op an engine cannot route before any worker starts. `OPS` is the op catalogue both sides use.

Pure Python: the patches themselves import torch, this module never does.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from invar import canonical
from invar.errors import ContractError
from invar.home import HOME

PATCHES_DIR = HOME / "patches"
"""Where the shipped patch folders live: one folder per patch, named by the patch."""

KERNEL_TOML = "kernel.toml"
"""The file that makes a folder a function kernel (with `kernel.py` beside it)."""

OPS: Mapping[str, Mapping[str, str]] = {
    "softmax": {"hf": "aten._softmax (eager attention's softmax, and every other softmax the model computes)"},
    "log_softmax": {"hf": "aten._log_softmax (the worker's log-probabilities of each step, and any other)"},
    "rms_norm": {"hf": "the forward of every module whose class name ends in RMSNorm (a module forward hook)"},
    "silu": {"hf": "aten.silu (the MLP's activation)"},
    "gelu": {"hf": "aten.gelu"},
    "matmul": {"hf": "aten.mm, addmm, bmm, baddbmm (every linear layer; eager attention's products too)",
               "vllm": "each linear layer's cpu_linear (x @ weight.T, then + bias)"},
    "linear": {"hf": "aten.mm and addmm as input @ weight.T + bias (every linear layer)",
               "vllm": "each linear layer's cpu_linear"},
    "attention": {"hf": "torch.nn.functional.scaled_dot_product_attention (transformers' sdpa attention)"},
}
"""The ops a function kernel may replace: op → {engine: where the host plugs it in}. An engine not listed for an op
cannot route it (MLX's ops are not torch ops: no function kernel runs there)."""

OP_REPLACES: Mapping[str, frozenset[str]] = {
    "softmax": frozenset({"aten._softmax"}),
    "log_softmax": frozenset({"aten._log_softmax"}),
    "rms_norm": frozenset({"hf.RMSNorm", "aten.mean.dim", "vllm.RMSNorm"}),
    "silu": frozenset({"aten.silu"}),
    "gelu": frozenset({"aten.gelu"}),
    "matmul": frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "vllm.cpu_linear"}),
    "linear": frozenset({"aten.mm", "aten.addmm", "vllm.cpu_linear"}),
    "attention": frozenset({"torch.scaled_dot_product_attention"}),
}
"""What each op's function kernel takes over, in the names `patch.py` patches give their `REPLACES`: two that
overlap are refused together by the worker, and `use init` leaves out of its batch-invariant base the ops a
candidate's kernel takes (`invar.contract.kernel_base`)."""

DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a kernel may declare."""

_IGNORED_DIRS = frozenset({"__pycache__"})
_IGNORED_SUFFIXES = (".pyc",)


def names() -> list[str]:
    """The patch names: every folder directly under `PATCHES_DIR` (hidden folders and `__pycache__` aside)."""
    if not PATCHES_DIR.is_dir():
        return []
    return sorted(p.name for p in PATCHES_DIR.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name not in _IGNORED_DIRS)


def is_path(reference: str | Path) -> bool:
    """Whether a reference is written as a path (a `Path`, a separator in it, or a leading `.` or `~`)."""
    if isinstance(reference, Path):
        return True
    return (os.sep in reference or (os.altsep is not None and os.altsep in reference)
            or reference.startswith((".", "~")))


def patch_dir(reference: str | Path, base: Path | None = None) -> Path:
    """The folder a reference names: a patch under `PATCHES_DIR`, or a folder path (relative to `base`, default
    the working directory). Neither is a `ContractError` naming both places and the patches there are."""
    if not is_path(reference) and str(reference) in names():
        return PATCHES_DIR / str(reference)
    folder = Path(os.path.expanduser(str(reference)))
    if not folder.is_absolute() and base is not None:
        folder = base / folder
    if folder.is_dir():
        return folder
    known = ", ".join(names()) or "none"
    where = f"relative to {base}" if base is not None else "relative to the working directory"
    if is_path(reference):
        raise ContractError(f"patch folder {folder} does not exist ({where}); point it at the kernel's folder")
    raise ContractError(f"unknown patch {str(reference)!r}: no folder of that path ({where}) and no patch of that "
                        f"name under INVAR_HOME's patches ({PATCHES_DIR} holds {known}); pass the folder as a path "
                        "(e.g. ./my-kernel) or name one of those")


def contract_key(reference: str | Path, base: Path) -> str:
    """How a declaration or contract in folder `base` names a reference: a name as is; a folder relative to `base`,
    with forward slashes and always a `/` (so it never reads as a name)."""
    if not is_path(reference) and str(reference) in names():
        return str(reference)
    folder = patch_dir(reference)
    rel = Path(os.path.relpath(folder.resolve(), base.resolve())).as_posix()
    return rel if "/" in rel else f"./{rel}"


def folder_files(folder: Path) -> dict[str, Path]:
    """The files the digest covers: relative path (forward slashes) → file, bytecode caches left out."""
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        # Pruned in place, so os.walk does not descend into bytecode caches.
        dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_DIRS)
        for fname in sorted(filenames):
            if fname.endswith(_IGNORED_SUFFIXES):
                continue
            full = Path(dirpath) / fname
            files[full.relative_to(folder).as_posix()] = full
    return files


def patch_digest(reference: str | Path, base: Path | None = None) -> str:
    """The digest of a patch, given its name or its folder (a `Path`, or a string written as a path).

    Like `invar.canonical.tree_digest`, with `__pycache__` folders and `*.pyc` files left out.
    """
    root = patch_dir(reference, base)
    files = {rel: canonical.file_sha256(full) for rel, full in folder_files(root).items()}
    if not files:
        raise ContractError(f"patch folder {root} holds no files; a patch needs at least its code and README")
    return canonical.digest(files)


def kept_digest(files: Mapping[str, bytes]) -> str:
    """`patch_digest` of a folder kept as bytes ({relative path: content}, as `kept_files` keeps it)."""
    import hashlib

    return canonical.digest({rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())})


def kept_files(folder: Path) -> dict[str, bytes]:
    """A patch folder's files as bytes, for a run to keep beside its records (`kept_digest` is its digest)."""
    return {rel: full.read_bytes() for rel, full in folder_files(folder).items()}


def check_folder(reference: str, sha256: str, folder: Path, where: str, *, declared: bool = False) -> None:
    """The folder must have the digest the contract (or, `declared`, the declaration) pins: else one line naming
    the folder, both digests, and what to do (`ContractError`)."""
    actual = patch_digest(folder)
    if actual == sha256:
        return
    if declared:
        raise ContractError(f"{where}: the patch folder {folder} has digest {actual}, but {sha256} was declared; "
                            "declare this folder's digest (invar use package prints it) or restore the folder")
    raise ContractError(f"{where}: the patch folder {folder} has digest {actual[:16]}…, the contract pins "
                        f"{sha256[:16]}… for {reference}: its files changed after use prepare; restore the folder "
                        "the contract names, or prepare the contract again from its declaration")


def available() -> dict[str, str]:
    """Every patch under `PATCHES_DIR`: name → digest."""
    return {name: patch_digest(name) for name in names()}


@dataclass(frozen=True)
class KernelSpec:
    """A function kernel's `kernel.toml`: the op it replaces, where it is meant to run, the dtypes it takes."""

    op: str
    """One of `OPS`."""
    engines: tuple[str, ...]
    """The engines it is meant for, each one that can route `op`."""
    dtypes: tuple[str, ...]
    """The dtypes it takes; inputs of other dtypes go to the stock op."""
    description: str
    """What the kernel is, in its author's words."""


def read_kernel(folder: Path) -> KernelSpec | None:
    """The folder's `kernel.toml`, checked (None: the folder is a `patch.py` patch, not a function kernel).

    Every mistake is one `ContractError` line naming the file, the key, and what to write instead.
    """
    path = folder / KERNEL_TOML
    if not path.is_file():
        return None
    where = str(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ContractError(f"{where}: not TOML ({str(exc).splitlines()[0]}); write op, engines, dtypes and "
                            "description as docs/kernels.md shows") from None
    unknown = sorted(set(doc) - {"op", "engines", "dtypes", "description"})
    if unknown:
        raise ContractError(f"{where}: unknown key {unknown[0]!r}; a kernel.toml holds op, engines, dtypes and "
                            "description")
    op = doc.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ContractError(f"{where}: op {op!r} is not in the catalogue; write one of {', '.join(OPS)}")
    engines = doc.get("engines", ["hf"])
    if not isinstance(engines, list) or not engines or not all(isinstance(e, str) for e in engines):
        raise ContractError(f"{where}: engines must be a non-empty list of engine names, e.g. [\"hf\"]")
    for engine in engines:
        check_routable(op, engine, where)
    dtypes = doc.get("dtypes", ["float32"])
    if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
        raise ContractError(f"{where}: dtypes must be a non-empty list of {', '.join(DTYPES)}; got {dtypes!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ContractError(f"{where}: description must be a string")
    if not (folder / "kernel.py").is_file():
        raise ContractError(f"{folder}: kernel.toml is there but kernel.py is not; write the function {op} in "
                            "kernel.py")
    return KernelSpec(op, tuple(engines), tuple(dtypes), description)


def check_routable(op: str, engine: str, where: str) -> None:
    """`op` must be routable on `engine` (`ContractError` naming the engines that can route it)."""
    if engine not in OPS[op]:
        can = ", ".join(sorted(OPS[op]))
        raise ContractError(f"{where}: op {op} cannot be routed on the {engine} engine; the engines that can are "
                            f"{can} (docs/kernels.md lists each op's)")


def check_engine(folder: Path, engine: str, where: str) -> None:
    """A function kernel in `folder` must be meant for `engine` and routable there (`ContractError`, one line);
    a `patch.py` patch is the worker's to accept or refuse."""
    kernel = read_kernel(folder)
    if kernel is None:
        return
    check_routable(kernel.op, engine, where)
    if engine not in kernel.engines:
        raise ContractError(f"{where}: its kernel.toml declares engines {', '.join(kernel.engines)}, not {engine}; "
                            f"add {engine} to engines if the kernel is meant for it")


def select(references: list[str], engine: str, option: str, base: Path | None = None) -> tuple[
        dict[str, str], dict[str, str]]:
    """The patches a command's `option` names, for a worker of `engine`: (key → digest, key → absolute folder).

    A name keeps its name as key; a folder's key is its path relative to `base` (a declaration's folder) with a
    `/` in it, or without `base` its absolute path. Every folder is hashed and a kernel's `kernel.toml` checked
    against the engine here, before any worker starts.
    """
    digests: dict[str, str] = {}
    folders: dict[str, str] = {}
    for reference in references:
        try:
            folder = patch_dir(reference).resolve()
            key = reference if not is_path(reference) and reference in names() else \
                contract_key(folder, base) if base is not None else str(folder)
            if key in digests:
                raise ContractError("given twice; give each patch once")
            digests[key] = patch_digest(folder)
            check_engine(folder, engine, str(folder))
        except ContractError as exc:
            raise ContractError(f"{option} {reference}: {exc}") from None
        if is_path(key):
            folders[key] = str(folder)
    return digests, folders
