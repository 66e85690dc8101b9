"""The host of a function kernel: a folder's `kernel.py` function put where the engine runs the op it replaces.

A kernel author writes one function with the stock op's signature (`softmax(input, dim, dtype=None)`, ...) and a
`kernel.toml` naming the op, the engines and the dtypes (docs/kernels.md). Everything else is the host's, so every
kernel is plumbed, counted and proven active the same way, and a kernel author never writes a dispatch mode:

- **Where it plugs in** (`invar.patches.OPS`): on Hugging Face a `TorchDispatchMode` below autograd takes the op's
  aten overloads (composites seen whole under inference mode are decomposed first, so the parts come back), except
  RMSNorm (a Python module in transformers: a global module forward hook replaces the output of every module whose
  class name ends in `RMSNorm`) and attention (`torch.nn.functional.scaled_dot_product_attention`, what transformers'
  sdpa attention calls). On vLLM (CPU) the linear layers' `cpu_linear` is the kernel (matmul, linear).
- **Dtypes**: an input of a dtype the kernel does not declare goes to the stock op, uncounted.
- **Proof**: every routed call is counted (`patch_calls`); a generate or score call in which the kernel never ran is
  an error naming the op, so no evidence is recorded of a package that did not run its kernel.
- **Refusals before any record**: at worker start the function is called once per declared dtype on a small seeded
  input of the op's signature (the self-check): a missing function, one that does not take the stock arguments,
  raises, returns another shape or dtype than the stock op, or returns NaN or infinity where the stock op is finite
  refuses the worker (one line, exit 2). During a call, a result of another shape or dtype is an error of that call.
- **Poison** (tests only): the last mantissa bit of every result is flipped.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from invar.patches import OP_REPLACES, KernelSpec

REPLACES = OP_REPLACES
"""What each op's kernel takes over, in the names the `patch.py` patches use: two that overlap are refused together."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class KernelRefused(Exception):
    """A kernel the worker will not start with: the message says what is wrong with it and what to change."""


def _flip_last_bit(t: torch.Tensor) -> torch.Tensor:
    """The same values with the lowest mantissa bit of every element flipped (the poison switch)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}
    if t.dtype not in ints:
        return t
    t = t.contiguous().clone()
    t.view(ints[t.dtype]).bitwise_xor_(1)
    return t


def _describe(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"shape {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
    return type(t).__name__


def _example(op: str, dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any], Callable[..., torch.Tensor]]:
    """A small seeded input of `op`'s signature and the stock op that answers it: (args, kwargs, stock)."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    if op in ("softmax", "log_softmax"):
        stock = torch.softmax if op == "softmax" else torch.log_softmax
        return (rand(2, 3, 7), -1), {}, stock
    if op == "rms_norm":
        return (rand(2, 3, 8), (8,), rand(8), 1e-6), {}, torch.nn.functional.rms_norm
    if op == "silu":
        return (rand(2, 3, 8),), {}, torch.nn.functional.silu
    if op == "gelu":
        return (rand(2, 3, 8),), {"approximate": "none"}, torch.nn.functional.gelu
    if op == "matmul":
        return (rand(2, 3, 4), rand(2, 4, 5)), {}, torch.matmul
    if op == "linear":
        return (rand(2, 3, 4), rand(5, 4), rand(5)), {}, torch.nn.functional.linear
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)
    return (q, k, v), {"is_causal": True}, torch.nn.functional.scaled_dot_product_attention


class FunctionKernel:
    """A function kernel loaded from its folder, with the interface of a `patch.py` patch (`REPLACES`, `apply`,
    `calls`, `reset_calls`), so a worker's `Patches` holds both kinds alike."""

    def __init__(self, reference: str, folder: Path, spec: KernelSpec) -> None:
        self.NAME = reference
        self.spec = spec
        self.REPLACES = REPLACES[spec.op]
        self.folder = folder
        self._calls = 0
        self._poison = False
        self._dtypes = frozenset(_DTYPES[d] for d in spec.dtypes)
        self.function = self._load()

    # -- loading and the self-check ----------------------------------------------------------------------------

    def _load(self) -> Callable[..., Any]:
        code = self.folder / "kernel.py"
        found = importlib.util.spec_from_file_location(f"invar_kernel_{abs(hash(str(self.folder)))}", code)
        if found is None or found.loader is None:
            raise KernelRefused(f"{code} cannot be imported; a kernel folder holds its function in kernel.py")
        module = importlib.util.module_from_spec(found)
        try:
            found.loader.exec_module(module)
        except SyntaxError as exc:
            raise KernelRefused(f"{code}: syntax error at line {exc.lineno} ({exc.msg}); fix kernel.py") from None
        except Exception as exc:
            raise KernelRefused(f"{code}: importing it raised {type(exc).__name__}: {_first_line(exc)}; fix "
                                "kernel.py") from None
        function = getattr(module, self.spec.op, None)
        if not callable(function):
            raise KernelRefused(f"{code} defines no function {self.spec.op} (kernel.toml's op); define "
                                f"{self.spec.op} with the stock op's signature (docs/kernels.md)")
        return function  # type: ignore[no-any-return]

    def self_check(self) -> None:
        """Call the kernel once per declared dtype on a small seeded input; `KernelRefused` naming what is wrong."""
        op = self.spec.op
        for dtype_name in self.spec.dtypes:
            args, kwargs, stock = _example(op, _DTYPES[dtype_name])
            try:
                inspect.signature(self.function).bind(*args, **kwargs)
            except TypeError as exc:
                raise KernelRefused(f"kernel.py's {op}{inspect.signature(self.function)} does not take the stock "
                                    f"op's arguments ({exc}); give it the signature docs/kernels.md lists for "
                                    f"{op}") from None
            except ValueError:
                pass  # a builtin without a signature: the call below decides
            expected = stock(*args, **kwargs)
            try:
                with torch.no_grad():
                    out = self.function(*args, **kwargs)
            except Exception as exc:
                raise KernelRefused(f"kernel.py's {op} raised {type(exc).__name__} on a {_describe(args[0])} input: "
                                    f"{_first_line(exc)}; fix the kernel") from None
            self._check_result(out, expected, args[0])
            if bool(torch.isfinite(expected).all()) and not bool(torch.isfinite(out).all()):
                raise KernelRefused(f"kernel.py's {op} returned NaN or infinity on a finite {_describe(args[0])} "
                                    "input where the stock op's result is finite; fix the kernel")

    def _check_result(self, out: Any, expected: torch.Tensor, given: Any) -> None:
        if not isinstance(out, torch.Tensor) or out.shape != expected.shape or out.dtype != expected.dtype:
            raise KernelRefused(f"kernel.py's {self.spec.op} returned {_describe(out)} for a {_describe(given)} "
                                f"input; the stock op returns {_describe(expected)}: return the stock op's shape "
                                "and dtype")

    # -- the patch interface --------------------------------------------------------------------------------------

    def calls(self) -> int:
        """Routed calls since the last `reset_calls()`."""
        return self._calls

    def reset_calls(self) -> None:
        self._calls = 0

    def never_called(self) -> str:
        """The error of a call in which the kernel did not run."""
        return (f"kernel {self.NAME}: the kernel was never called: op {self.spec.op} is not on this engine's path for "
                f"this model (dtypes {', '.join(self.spec.dtypes)}; docs/kernels.md says where each op plugs in)")

    def takes(self, *tensors: Any) -> bool:
        """Whether the kernel answers for these inputs: floating tensors of a declared dtype."""
        return all(isinstance(t, torch.Tensor) and t.dtype in self._dtypes for t in tensors)

    def run(self, expected_shape: tuple[int, ...], expected_dtype: torch.dtype, given: torch.Tensor, *args: Any,
            **kwargs: Any) -> torch.Tensor:
        """The kernel on one routed call: its result checked for the stock shape and dtype, counted, poisoned."""
        out = self.function(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(expected_shape) \
                or out.dtype != expected_dtype:
            raise RuntimeError(f"kernel {self.NAME}: {self.spec.op} returned {_describe(out)} for a "
                               f"{_describe(given)} input; the stock op returns shape {tuple(expected_shape)} "
                               f"{str(expected_dtype).removeprefix('torch.')}: return the stock op's shape and dtype")
        self._calls += 1
        return _flip_last_bit(out) if self._poison else out

    def apply(self, engine: str, *, poison: bool = False) -> None:
        """Check the kernel (the self-check) and install it for `engine`, before any model is loaded."""
        if engine not in self.spec.engines:
            raise KernelRefused(f"kernel.toml declares engines {', '.join(self.spec.engines)}, not {engine}; add "
                                f"{engine} to engines if the kernel is meant for it")
        from invar.patches import check_routable

        try:
            check_routable(self.spec.op, engine, "kernel.toml")
        except Exception as exc:
            raise KernelRefused(str(exc)) from None
        self.self_check()
        self._poison = poison
        if engine == "hf":
            _install_hf(self)  # for good: the worker serves with it until it exits
        else:
            _install_vllm(self)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else repr(exc)


# -- Hugging Face ------------------------------------------------------------------------------------------------


def _float_out(*ts: torch.Tensor) -> torch.dtype:
    return torch.result_type(*ts)


class _KernelMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    """Routes the op's aten overloads to the kernel; everything else as usual. Inside the handler the mode is off,
    so the kernel's own torch calls reach the stock kernels."""

    def __init__(self, kernel: FunctionKernel) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.kernel = kernel
        op = kernel.spec.op
        aten = torch.ops.aten
        self.composite: frozenset[Any] = frozenset(
            {"softmax": {aten.softmax.int}, "log_softmax": {aten.log_softmax.int},
             "matmul": {aten.linear.default, aten.matmul.default},
             "linear": {aten.linear.default, aten.matmul.default}}.get(op, set()))
        table: dict[str, dict[Any, Callable[..., Any]]] = {
            "softmax": {aten._softmax.default: self._softmax},
            "log_softmax": {aten._log_softmax.default: self._softmax},
            "silu": {aten.silu.default: self._silu},
            "gelu": {aten.gelu.default: self._gelu},
            "matmul": {aten.mm.default: self._mm, aten.bmm.default: self._mm, aten.addmm.default: self._addmm,
                       aten.baddbmm.default: self._addmm},
            "linear": {aten.mm.default: self._linear_mm, aten.addmm.default: self._linear_addmm},
        }
        self.ops = table.get(op, {})

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in self.composite:
            with self:
                return func.decompose(*args, **kwargs)
        impl = self.ops.get(func)
        if impl is not None:
            out = impl(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)

    def _softmax(self, x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
        if half_to_float or not self.kernel.takes(x):
            return NotImplemented
        return self.kernel.run(tuple(x.shape), x.dtype, x, x, dim)

    def _silu(self, x: torch.Tensor) -> Any:
        if not self.kernel.takes(x):
            return NotImplemented
        return self.kernel.run(tuple(x.shape), x.dtype, x, x)

    def _gelu(self, x: torch.Tensor, approximate: str = "none") -> Any:
        if not self.kernel.takes(x):
            return NotImplemented
        return self.kernel.run(tuple(x.shape), x.dtype, x, x, approximate=approximate)

    def _mm(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        if not self.kernel.takes(a, b):
            return NotImplemented
        return self.kernel.run((*a.shape[:-1], b.shape[-1]), a.dtype, a, a, b)

    def _addmm(self, base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1,
               alpha: float = 1) -> Any:
        if not self.kernel.takes(base, a, b):
            return NotImplemented
        out = self._mm(a, b)
        if alpha != 1:
            out = out * alpha
        return out if beta == 0 else out + (base if beta == 1 else base * beta)

    def _linear_mm(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        if not self.kernel.takes(a, b):
            return NotImplemented
        return self.kernel.run((a.shape[0], b.shape[1]), a.dtype, a, a, b.t(), None)

    def _linear_addmm(self, base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1,
                      alpha: float = 1) -> Any:
        if beta != 1 or alpha != 1 or not self.kernel.takes(base, a, b) or base.ndim != 1:
            return NotImplemented
        return self.kernel.run((a.shape[0], b.shape[1]), a.dtype, a, a, b.t(), base)


STOCK_SDPA = torch.nn.functional.scaled_dot_product_attention
"""The stock attention, kept before any attention kernel replaces it."""


def stock_op(op: str) -> Callable[..., torch.Tensor]:
    """The stock op a kernel of `op` replaces, with the kernel's signature (`invar.patches.OPS`)."""
    f = torch.nn.functional
    table: dict[str, Callable[..., torch.Tensor]] = {
        "softmax": torch.softmax, "log_softmax": torch.log_softmax, "rms_norm": f.rms_norm, "silu": f.silu,
        "gelu": f.gelu, "matmul": torch.matmul, "linear": f.linear, "attention": STOCK_SDPA}
    return table[op]


def _install_hf(kernel: FunctionKernel) -> Callable[[], None]:
    """Route the kernel's op to it in this process; returns what undoes that (the kernel check's capture uses it)."""
    op = kernel.spec.op
    if op == "rms_norm":
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not type(module).__name__.endswith("RMSNorm") or not args or not kernel.takes(args[0]):
                return None
            x = args[0]
            weight = getattr(module, "weight", None)
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
            return kernel.run(tuple(output.shape), output.dtype, x, x, (x.shape[-1],), weight, eps)

        handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return handle.remove
    if op == "attention":
        stock = torch.nn.functional.scaled_dot_product_attention

        def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not kernel.takes(query, key, value):
                return stock(query, key, value, *args, **kwargs)
            shape = (*query.shape[:-1], value.shape[-1])
            return kernel.run(shape, query.dtype, query, query, key, value, *args, **kwargs)

        torch.nn.functional.scaled_dot_product_attention = sdpa

        def restore() -> None:
            torch.nn.functional.scaled_dot_product_attention = stock

        return restore
    mode = _KernelMode(kernel)
    # Entered for good: the worker serves every call on this thread (autograd carries the mode to backward).
    mode.__enter__()  # type: ignore[no-untyped-call]

    def leave() -> None:
        mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    return leave


# -- vLLM (CPU) ---------------------------------------------------------------------------------------------------


def _install_vllm(kernel: FunctionKernel) -> None:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise KernelRefused("vLLM must run its engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 before "
                            "vLLM starts), or the kernel would not be where the model runs")
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    as_matmul = kernel.spec.op == "matmul"

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.ndim != 2:
            original(layer, remove_weight)
            return
        w = weight.detach()

        def cpu_linear(x: torch.Tensor, _weight: Any, bias: torch.Tensor | None) -> torch.Tensor:
            if not kernel.takes(x, w):
                return torch.nn.functional.linear(x, w, bias)
            shape = (*x.shape[:-1], w.shape[0])
            if as_matmul:
                out = kernel.run(shape, x.dtype, x, x, w.t())
                return out if bias is None else out + bias
            return kernel.run(shape, x.dtype, x, x, w, bias)

        layer.cpu_linear = cpu_linear  # type: ignore[assignment]  # vLLM sets the attribute it calls the same way

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
