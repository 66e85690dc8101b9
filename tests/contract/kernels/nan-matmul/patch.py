"""nan-matmul: a kernel that produces NaN, as a test fixture. Every float32 matrix product of more than one row is
the stock product with its first element replaced by NaN (an uninitialised accumulator, a division by a zero norm):
the model's log-probabilities become NaN mid-call and sampling cannot proceed.

Plugs in as the shipped patches do on Hugging Face: a `TorchDispatchMode` below autograd takes `aten.mm`, `addmm`,
`bmm` and `baddbmm`; `linear` and `matmul` seen whole are decomposed into those.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "nan-matmul"
REPLACES = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"})

_state: dict[str, Any] = {"calls": 0, "poison": False, "engine": None}

_PRODUCTS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
                       torch.ops.aten.baddbmm.default})
_COMPOSITE = frozenset({torch.ops.aten.linear.default, torch.ops.aten.matmul.default})


def calls() -> int:
    return int(_state["calls"])


def reset_calls() -> None:
    _state["calls"] = 0


class NanMode(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _COMPOSITE:
            with self:
                return func.decompose(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _PRODUCTS and out.dtype == torch.float32:
            _state["calls"] += 1
            out = out.clone()
            out.view(-1)[0] = float("nan")
        return out


def apply(engine: str, *, poison: bool = False) -> None:
    if engine != "hf":
        raise ValueError(f"{NAME}: no implementation for engine {engine!r}; it covers hf")
    _state["poison"] = poison
    NanMode().__enter__()
    _state["engine"] = engine
