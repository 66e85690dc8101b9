"""bf16-matmul: a silent precision downgrade, as a test fixture. Every float32 matrix product is computed with its
operands rounded to bfloat16 (accumulated as torch's bfloat16 product does) and the result cast back to float32, the
way a kernel that "supports fp32" by running a half-precision path does. Results stay within about 1e-2 relative of
the stock product, so a half-precision allclose passes it; log-probabilities move by far more than float32 rounding.

Plugs in as the shipped patches do on Hugging Face: a `TorchDispatchMode` below autograd takes `aten.mm`, `addmm`,
`bmm` and `baddbmm`; `linear` and `matmul` seen whole are decomposed into those. Batch invariant (each row's product
does not depend on the other rows), so only the task bound and the measurements can see it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "bf16-matmul"
REPLACES = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"})

_state: dict[str, Any] = {"calls": 0, "poison": False, "engine": None}


def calls() -> int:
    return int(_state["calls"])


def reset_calls() -> None:
    _state["calls"] = 0


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in bfloat16, returned in a's dtype."""
    out = torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16)).to(a.dtype)
    _state["calls"] += 1
    if _state["poison"]:
        out = out.contiguous().clone()
        out.view(torch.int32).bitwise_xor_(1)
    return out


def _scaled(base: torch.Tensor, out: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    if alpha != 1:
        out = out * alpha
    return out if beta == 0 else out + (base if beta == 1 else base * beta)


_COMPOSITE = frozenset({torch.ops.aten.linear.default, torch.ops.aten.matmul.default})


class Bf16Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _COMPOSITE:
            with self:
                return func.decompose(*args, **kwargs)
        floats = all(t.dtype == torch.float32 for t in args if isinstance(t, torch.Tensor))
        if floats and func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
            return _product(args[0], args[1])
        if floats and func in (torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default):
            return _scaled(args[0], _product(args[1], args[2]), kwargs.get("beta", 1), kwargs.get("alpha", 1))
        return func(*args, **kwargs)


def apply(engine: str, *, poison: bool = False) -> None:
    if engine != "hf":
        raise ValueError(f"{NAME}: no implementation for engine {engine!r}; it covers hf")
    _state["poison"] = poison
    Bf16Mode().__enter__()  # for good: the worker serves every call on this thread
    _state["engine"] = engine
