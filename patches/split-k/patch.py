"""split-k: a deliberately batch-variant matrix product, the kind a GPU library picks by shape.

The reduction over K is cut into a number of contiguous chunks that depends on the number of rows M (small M: more
chunks, as split-K heuristics do to keep a device busy), each chunk is multiplied by the stock kernel, and the
partial products are added in chunk order. Every result is within float rounding of the stock product, so it
passes an allclose unit test; but a row's bits depend on how many rows share the call, so a prompt alone and the
same prompt in a batch get different log-probabilities (tokens usually agree). It exists to be caught: a candidate
that is fine by allclose and not bit-for-bit batch invariant.

Where it plugs in is the same as the fixed-block patch's matrix products: on Hugging Face a `TorchDispatchMode`
below autograd takes `aten.mm`, `addmm`, `bmm` and `baddbmm` (what `nn.Linear` and `torch.matmul` decompose to);
on vLLM (CPU) `dispatch_cpu_unquantized_gemm` is replaced so that each linear layer's `cpu_linear` is this product
instead of a oneDNN handle. Softmax, normalization and attention stay stock. Every replaced call is counted
(`calls()`); with `poison` the last mantissa bit of every result is flipped (tests only).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "split-k"
REPLACES = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "bitsandbytes.gemm_4bit",
                      "vllm.cpu_linear"})
"""What this patch takes over; two patches that replace the same thing cannot be applied together."""

_state: dict[str, Any] = {"calls": 0, "poison": False, "engine": None, "mode": None}


def calls() -> int:
    """Replaced-op invocations since the last `reset_calls()`."""
    return int(_state["calls"])


def reset_calls() -> None:
    _state["calls"] = 0


def splits(rows: int, k: int) -> int:
    """How many K-chunks a product with `rows` rows gets: more for fewer rows, never more than K."""
    if rows <= 8:
        wanted = 8
    elif rows <= 16:
        wanted = 4
    elif rows <= 64:
        wanted = 2
    else:
        wanted = 1
    return max(1, min(wanted, k))


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, M, K] @ [B, K, N]: K split by `splits(B * M, K)`, stock products per chunk, added in chunk order."""
    k = a.shape[-1]
    parts = splits(a.shape[0] * a.shape[1], k)
    bounds = [k * i // parts for i in range(parts + 1)]
    chunks = list(itertools.pairwise(bounds))
    out = torch.bmm(a[..., chunks[0][0]:chunks[0][1]], b[:, chunks[0][0]:chunks[0][1]])
    for lo, hi in chunks[1:]:
        out = out + torch.bmm(a[..., lo:hi], b[:, lo:hi])
    return out


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[M, K] @ [K, N] with K split by `splits(M, K)`."""
    return bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = mm(flat, weight.t())
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _flip_last_bit(t: torch.Tensor) -> torch.Tensor:
    """The same values with the lowest mantissa bit of every element flipped (the poison switch)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}
    if t.dtype not in ints:
        return t
    t = t.contiguous().clone()
    t.view(ints[t.dtype]).bitwise_xor_(1)
    return t


def _done(out: torch.Tensor) -> torch.Tensor:
    _state["calls"] += 1
    return _flip_last_bit(out) if _state["poison"] else out


def _float(*ts: torch.Tensor) -> bool:
    return all(t.is_floating_point() for t in ts)


def _aten_mm(a: torch.Tensor, b: torch.Tensor) -> Any:
    return mm(a, b) if _float(a, b) else NotImplemented


def _aten_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> Any:
    if not _float(bias, a, b):
        return NotImplemented
    out = mm(a, b)
    if alpha != 1:
        out = out * alpha
    return out if beta == 0 else out + (bias if beta == 1 else bias * beta)


def _aten_bmm(a: torch.Tensor, b: torch.Tensor) -> Any:
    return bmm(a, b) if _float(a, b) else NotImplemented


def _aten_baddbmm(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1,
                  alpha: float = 1) -> Any:
    if not _float(base, a, b):
        return NotImplemented
    out = bmm(a, b)
    if alpha != 1:
        out = out * alpha
    return out if beta == 0 else out + (base if beta == 1 else base * beta)


def _bnb_gemm_4bit(a: torch.Tensor, packed: torch.Tensor, shape: Any, absmax: torch.Tensor, blocksize: int,
                   quant_type: str, bias: torch.Tensor | None = None, absmax_8bit: torch.Tensor | None = None,
                   absmax_code: torch.Tensor | None = None, absmax_offset: torch.Tensor | None = None) -> Any:
    """bitsandbytes' NF4/FP4 product (its default CPU implementation: dequantize, then multiply), with this patch's
    product. Without it, NF4 inference would bypass the patch: bitsandbytes runs it as one opaque op."""
    if absmax_8bit is not None:
        absmax = torch.ops.bitsandbytes.dequantize_blockwise.default(absmax_8bit, absmax, absmax_code, 256,
                                                                     torch.float32) + absmax_offset
    weight = torch.ops.bitsandbytes.dequantize_4bit.default(packed, absmax, blocksize, quant_type, shape, a.dtype)
    return linear(a, weight, bias)


_BY_NAME: dict[str, Callable[..., Any]] = {"bitsandbytes::gemm_4bit": _bnb_gemm_4bit}
"""Ops registered by a library that may load after the patch (bitsandbytes), matched by name."""


_ATEN: dict[Any, Callable[..., Any]] = {
    torch.ops.aten.mm.default: _aten_mm,
    torch.ops.aten.addmm.default: _aten_addmm,
    torch.ops.aten.bmm.default: _aten_bmm,
    torch.ops.aten.baddbmm.default: _aten_baddbmm,
}


_COMPOSITE = frozenset({torch.ops.aten.linear.default, torch.ops.aten.matmul.default})
"""Composite ops the mode may see whole (under `torch.inference_mode`) rather than as the products they decompose
into; the mode decomposes them itself."""


class SplitKMode(TorchDispatchMode):
    """Runs the replaced aten products split along K; everything else as usual. Inside the handler the mode is
    off, so the chunks' own `torch.bmm` calls reach the stock kernel."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _COMPOSITE:
            # Seen undecomposed (under inference mode): decompose with the mode on, so the parts come back here.
            with self:
                return func.decompose(*args, **(kwargs or {}))
        impl = _ATEN.get(func) or _BY_NAME.get(getattr(func, "_name", ""))
        if impl is not None:
            out = impl(*args, **(kwargs or {}))
            if out is not NotImplemented:
                return _done(out)
        return func(*args, **(kwargs or {}))


def _apply_vllm() -> None:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise RuntimeError("split-k: vLLM must run its engine core in this process (set "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM starts), or the patch would not be active "
                           "where the model runs")
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.ndim != 2:
            original(layer, remove_weight)
            return
        w = weight.detach()

        def cpu_linear(x: torch.Tensor, _weight: Any, bias: torch.Tensor | None) -> torch.Tensor:
            return _done(linear(x, w, bias))

        layer.cpu_linear = cpu_linear

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm  # type: ignore[assignment]


def apply(engine: str, *, poison: bool = False) -> None:
    """Install the patch in this process for `engine` ("hf" or "vllm"), before any model is loaded."""
    if _state["engine"] is not None:
        raise RuntimeError(f"{NAME}: already applied (for {_state['engine']})")
    _state["poison"] = poison
    if engine == "hf":
        mode = SplitKMode()
        # Entered for good: the worker serves every call on this thread (autograd carries the mode to backward).
        mode.__enter__()
        _state["mode"] = mode
    elif engine == "vllm":
        _apply_vllm()
    else:
        raise ValueError(f"{NAME}: no implementation for engine {engine!r}; it covers hf and vllm")
    _state["engine"] = engine
