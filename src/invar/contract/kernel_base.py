"""The batch-invariant base a kernel contract proposes: the shipped `invariant-*` function kernels, less the ops the
candidate's kernel replaces.

Stock Hugging Face on CPU is not batch invariant (its matrix products block by the batch's shape), so invariance
relative to a stock reference judges the engine around a kernel as much as the kernel: a correct kernel that changes
any bit upstream reshuffles which units vary, and where the stock engine varies on every unit nothing is covered. With
the base, the reference is the stock engine plus the whole base (batch invariant), and the candidate the same engine
plus the base's ops the kernel does not replace plus the kernel, so a unit that varies under the candidate varies
because of what the kernel adds (docs/kernel-contracts.md, "What use init --candidate-patch proposes").

Pure: a kernel's ops are read from its `kernel.toml` (`op`) or, for a `patch.py` patch, from its `REPLACES` literal
(parsed, never imported: the core imports no torch).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from invar.errors import InvarError
from invar.patches import OP_REPLACES, read_kernel

BASE: Mapping[str, str] = {"matmul": "invariant-matmul", "softmax": "invariant-softmax",
                           "log_softmax": "invariant-log-softmax", "rms_norm": "invariant-rms-norm"}
"""The base: op → the shipped function kernel (a name under patches/) that makes it batch invariant."""

BASE_ENGINE = "hf"
"""The engine the base routes every op on (vLLM's attention and MLX's ops are out of a function kernel's reach)."""


@dataclass(frozen=True)
class BaseProposal:
    """What the base adds to each side of a kernel contract, or why there is none."""

    reference: tuple[str, ...]
    """The base's kernels the reference gains (the whole base, or none)."""
    candidate: tuple[str, ...]
    """The base's kernels the candidate gains: those whose op no kernel of the candidate replaces."""
    absent: str | None
    """Why the contract has no base (None when it has one)."""


def replaced_names(folder: Path) -> frozenset[str] | str:
    """What a kernel folder takes over, in `REPLACES` names; a string saying why it cannot be known."""
    spec = read_kernel(folder)
    if spec is not None:
        return OP_REPLACES[spec.op] if spec.op != "attention" else "it replaces attention, which runs under SDPA, " \
            "where the base's softmax and products are not on the model's path"
    try:
        tree = ast.parse((folder / "patch.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return f"{folder / 'patch.py'} cannot be read for its REPLACES"
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "REPLACES":
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                    value.func.id in ("frozenset", "set") and len(value.args) == 1:
                value = value.args[0]
            try:
                names = ast.literal_eval(value)
            except ValueError:
                break
            if isinstance(names, (set, frozenset, list, tuple)) and all(isinstance(n, str) for n in names):
                return frozenset(names)
            break
    return f"{folder / 'patch.py'} states no literal REPLACES (a set of op names) to leave out of the base"


def propose_base(kernels: Mapping[str, Path], *, reference_engine: str, candidate_engine: str, dtypes: set[str],
                 quantized: bool, attention: str | None) -> BaseProposal:
    """The base for a candidate running `kernels` (key → folder) against a stock reference; `attention`: an
    attn_implementation either side's launch chose (None: the workers choose)."""

    def absent(why: str) -> BaseProposal:
        return BaseProposal((), (), f"no batch-invariant base: {why}")

    if reference_engine != BASE_ENGINE or candidate_engine != BASE_ENGINE:
        return absent("it routes its ops on the hf engine only")
    if dtypes != {"float32"} or quantized:
        return absent("its kernels take float32 inputs of unquantized weights only")
    if attention not in (None, "eager"):
        return absent(f"its softmax runs under eager attention, and attn_implementation={attention} was chosen")
    taken: set[str] = set()
    for key, folder in kernels.items():
        try:
            names = replaced_names(folder)
        except InvarError as exc:
            names = str(exc)
        if isinstance(names, str):
            return absent(f"{key}: {names}")
        taken |= names
    if "aten.mm" in taken and "aten.bmm" not in taken:
        return absent("the candidate's kernel takes the linear layers' products (aten.mm) but not attention's "
                      "(aten.bmm), and the base's matmul routes both together")
    keep = tuple(name for op, name in BASE.items() if not OP_REPLACES[op] & taken)
    return BaseProposal(tuple(BASE.values()), keep, None)
