"""fixed-block: a batch-invariant candidate. Every reduction a row's result depends on is done in fixed K-blocks,
in a fixed order, from that row's data alone, so a prompt gets the same bits alone, in a batch, or padded.

Decisions:

- **Explicit arithmetic, no BLAS.** A matrix product is computed with elementwise multiplies and adds only: the
  reduction axis is cut into blocks of `BLOCK` (16) elements, each block is summed by a fixed pairwise tree (slot i
  with slot i + h), and block sums are added one after another from the first block, starting at +0. Elementwise
  IEEE products and sums are exactly rounded whatever the tensor's shape, so row i of the result depends on row i of
  the input and nothing else: not on the number of rows M, nor on their order. A BLAS picks its blocking (and with
  it the rounding) from the shape, which is why the stock engines are not batch invariant.
- **Blocks are anchored at the end of the reduction axis.** Left padding (the Hugging Face worker left-pads a batch
  to its longest prompt) puts extra positions at the start of the attention's key axis, whose softmax weights are
  exactly 0. With blocks counted from the end, and zero-padding of the axis to a whole number of blocks at the start,
  a row's real values land in the same slots of the same blocks whatever the padding; leading zero blocks add +0.
  So the attention's softmax and its product with V give the same bits padded or not.
- **softmax / log_softmax** take the row maximum (exact), exp(x - max) elementwise, and the same fixed-block sum;
  **RMSNorm**'s mean of squares is the same fixed-block sum divided by the row length. Half-precision inputs are
  computed in float32 and rounded once at the end.
- **Where it plugs in.** Hugging Face (transformers): a `TorchDispatchMode` pushed for the worker's thread, below
  autograd, replaces `aten.mm`, `addmm`, `bmm`, `baddbmm`, `mv`, `_softmax`, `_log_softmax`, `mean.dim` over the
  last axis (Qwen3's RMSNorm) and bitsandbytes' NF4 product `gemm_4bit` (dequantize, then this product);
  `nn.Linear`, `torch.matmul` and `F.linear` reach these after decomposition. The worker loads the model with eager
  attention when a patch is active, since SDPA's fused CPU kernel would bypass them. vLLM (CPU): linear layers run
  `layer.cpu_linear`, which `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm` sets to a oneDNN handle
  after loading (an aten override never sees it); the patch replaces that function so `cpu_linear` is the
  fixed-block product (the weight is kept, not handed to oneDNN). `RMSNorm.forward_native` (what `forward_cpu`
  calls) is replaced, and the sampler (`Sampler.forward`, `Sampler.compute_logprobs`) runs under the dispatch mode,
  so the reported log-probabilities are the fixed-block log_softmax. vLLM's CPU attention kernel and its LoRA
  kernels are left as they are (attention is already bit-identical alone vs in a batch on this build).
- **Proof of activity**: every replaced op counts its invocations (`calls()`); the worker reports the count per
  call. With `poison`, every replaced op flips the last mantissa bit of its result (tests only).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "fixed-block"
BLOCK = 16
"""Elements per reduction block (a power of two: each block is summed by a pairwise tree)."""
CHUNK_ELEMENTS = 1 << 17
"""Largest intermediate product tensor (elements); rows are processed in chunks that fit (rows are independent)."""
REPLACES = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.mv", "aten._softmax",
                      "aten._log_softmax", "aten.mean.dim", "bitsandbytes.gemm_4bit", "vllm.cpu_linear",
                      "vllm.RMSNorm", "vllm.Sampler"})
"""What this patch takes over; two patches that replace the same thing cannot be applied together."""

_state: dict[str, Any] = {"calls": 0, "poison": False, "engine": None, "mode": None, "in_sampler": False,
                          "kernel": None, "implementation": None}


def calls() -> int:
    """Replaced-op invocations since the last `reset_calls()`."""
    return int(_state["calls"])


def reset_calls() -> None:
    _state["calls"] = 0


# -- the kernels (pure functions of their inputs; the tests call them directly) ---------------------------------------


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _tree(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (size a power of two) by a fixed pairwise tree: slot i + slot i + h, halving each level."""
    width = x.shape[dim]
    while width > 1:
        half = width // 2
        x = x.narrow(dim, 0, half) + x.narrow(dim, half, half)
        width = half
    return x.squeeze(dim)


def _serial(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` one slice after another, from the first, starting at +0 (so leading zeros change nothing)."""
    acc = torch.zeros_like(x.select(dim, 0))
    for j in range(x.shape[dim]):
        acc = acc + x.select(dim, j)
    return acc


def _left_pad(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-pad `dim` at its start to a whole number of blocks (blocks are anchored at the axis's end)."""
    pad = (-x.shape[dim]) % BLOCK
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)


def block_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum over `dim` in fixed blocks of `BLOCK`, anchored at the end of the axis: tree in a block, blocks in order."""
    lib = _kernel()
    if lib is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.ndim > 0 and x.shape[dim]:
        return _block_sum_c(lib, x, dim, keepdim)
    return block_sum_torch(x, dim, keepdim)


def block_sum_torch(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """`block_sum` in torch operations (the reference the compiled kernel matches bit for bit)."""
    dim = dim % x.ndim
    if x.shape[dim] == 0:
        return x.sum(dim, keepdim=keepdim)
    x = _left_pad(x, dim)
    blocks = x.shape[dim] // BLOCK
    x = x.unflatten(dim, (blocks, BLOCK))
    out = _serial(_tree(x, dim + 1), dim)
    return out.unsqueeze(dim) if keepdim else out


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, M, K] @ [B, K, N] → [B, M, N]; each output element a fixed-block dot product of its row and column."""
    lib = _kernel()
    if lib is not None and _compute_dtype(a) == torch.float32 and a.device.type == b.device.type == "cpu":
        return _bmm_c(lib, a, b)
    return bmm_torch(a, b)


def bmm_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`bmm` in torch elementwise operations (the reference the compiled kernel matches bit for bit)."""
    dtype = a.dtype
    cd = _compute_dtype(a)
    a, b = _left_pad(a.to(cd), 2), _left_pad(b.to(cd), 1)
    batch, rows, k = a.shape
    n = b.shape[2]
    blocks = k // BLOCK
    if k == 0:
        return torch.zeros((batch, rows, n), dtype=dtype, device=a.device)
    # Block-major views: a_blocks[j, i] is column j*BLOCK + i of a, b_blocks[j, i] row j*BLOCK + i of b.
    a_blocks = a.permute(2, 0, 1).reshape(blocks, BLOCK, batch, rows, 1)
    b_blocks = b.permute(1, 0, 2).reshape(blocks, BLOCK, batch, 1, n)
    out = torch.empty((batch, rows, n), dtype=cd, device=a.device)
    # Rows are independent and each block's tree is the same elementwise arithmetic however many blocks are
    # multiplied at once, so how the work is cut (to bound memory, or to save calls when M is small) cannot change
    # any bit: only the sizes of the intermediate tensors depend on M.
    per_block_row = BLOCK * batch * n
    step = max(1, CHUNK_ELEMENTS // per_block_row)
    group = max(1, min(blocks, CHUNK_ELEMENTS // (per_block_row * min(step, rows))))
    for start in range(0, rows, step):
        acc = torch.zeros((batch, min(step, rows - start), n), dtype=cd, device=a.device)
        for first in range(0, blocks, group):
            products = a_blocks[first:first + group, :, :, start:start + step] * b_blocks[first:first + group]
            sums = _tree(products, 1)  # [g, B, m, N]: one sum per block
            for j in range(sums.shape[0]):
                acc = acc + sums[j]
        out[:, start:start + step] = acc
    return out.to(dtype)


# -- the compiled kernels (kernel.c): the same operations in the same order, without a Python loop per block ---------

KERNEL_SOURCE = Path(__file__).resolve().parent / "kernel.c"
KERNEL_FLAGS = ("-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared")
"""No FMA contraction and no reassociation: each product and sum stays one rounded IEEE operation (kernel.c)."""


def _vector_flags() -> tuple[str, ...]:
    """AVX2 where the CPU has it (wider vectors, same operations); never FMA, which would fuse a product into a
    sum and change its rounding."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ()
    return ("-mavx2", "-mno-fma") if "avx2" in flags else ()


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "invar" / "fixed-block"


def _build() -> tuple[ctypes.CDLL | None, str]:
    """The compiled kernels, built once per source, compiler and flags into the user's cache (concurrent workers
    each write their own file and rename it into place); (None, why) where no C compiler builds them."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "torch operations (no C compiler on PATH to build kernel.c)"
    flags = (*KERNEL_FLAGS, *_vector_flags())
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30,
                                 check=True).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return None, f"torch operations ({compiler} --version failed: {exc})"
    source = KERNEL_SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode()])).hexdigest()[:32]
    described = f"kernel.c built by {version} with {' '.join(flags)}"
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"invar-fixed-block-{os.getuid()}"):
        target = folder / f"kernel-{key}.so"
        try:
            if not target.exists():
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".kernel-", suffix=".so", dir=folder)
                os.close(fd)
                try:
                    subprocess.run([compiler, *flags, "-o", tmp, str(KERNEL_SOURCE)], capture_output=True,
                                   text=True, timeout=120, check=True)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            lib = ctypes.CDLL(str(target))
        except subprocess.CalledProcessError as exc:
            return None, f"torch operations ({compiler} could not build kernel.c: {exc.stderr.strip()[:200]})"
        except OSError:
            continue  # a cache folder that cannot be written: the next one
        p, i = ctypes.c_void_p, ctypes.c_int64
        lib.fb_bmm_f32.argtypes = [p, i, i, p, i, i, i, p, i, i, i, i, p]
        lib.fb_bmm_f32.restype = None
        lib.fb_rowsum_f32.argtypes = [p, i, i, i, p]
        lib.fb_rowsum_f32.restype = None
        return lib, described
    return None, "torch operations (no writable folder to build kernel.c in)"


def _kernel() -> ctypes.CDLL | None:
    """The compiled kernels once built (see `implementation`), else None: the torch operations compute."""
    if _state["implementation"] is None:
        _state["kernel"], _state["implementation"] = _build()
        print(f"{NAME}: {_state['implementation']}", file=sys.stderr, flush=True)
    lib: ctypes.CDLL | None = _state["kernel"]
    return lib


def implementation() -> str:
    """What computes this patch's products and sums in this process: the compiled kernel (with its compiler and
    flags) or the torch operations (with the reason). Either gives the same bits; the kernel is faster."""
    _kernel()
    return str(_state["implementation"])


def _bmm_c(lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dtype = a.dtype
    a, b = _left_pad(a.to(torch.float32), 2), _left_pad(b.to(torch.float32), 1)
    if a.shape[2] and a.stride(2) != 1:
        a = a.contiguous()
    batch, rows, k = a.shape
    n = b.shape[2]
    out = torch.empty((batch, rows, n), dtype=torch.float32)
    if batch and rows and n:
        scratch = torch.empty(max(k, 1) * 16, dtype=torch.float32)
        lib.fb_bmm_f32(a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0), b.stride(1), b.stride(2),
                       out.data_ptr(), batch, rows, k, n, scratch.data_ptr())
    return out.to(dtype)


def _block_sum_c(lib: ctypes.CDLL, x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    dim = dim % x.ndim
    moved = _left_pad(x.movedim(dim, -1), x.ndim - 1)
    flat = moved.reshape(-1, moved.shape[-1])
    if flat.stride(1) != 1 or (flat.shape[0] > 1 and flat.stride(0) != flat.shape[1]):
        flat = flat.contiguous()
    out = torch.empty(flat.shape[0], dtype=torch.float32)
    if flat.shape[0]:
        lib.fb_rowsum_f32(flat.data_ptr(), flat.stride(0), flat.shape[0], flat.shape[1], out.data_ptr())
    out = out.reshape(moved.shape[:-1])
    return out.unsqueeze(dim) if keepdim else out


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[M, K] @ [K, N] → [M, N], row by row independent of M (see `bmm`)."""
    return bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias), every row of x on its own."""
    flat = x.reshape(-1, x.shape[-1])
    out = mm(flat, weight.t())
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(_compute_dtype(x))
    e = torch.exp(x - torch.amax(x, dim=dim, keepdim=True))
    return (e / block_sum(e, dim, keepdim=True)).to(dtype)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(_compute_dtype(x))
    shifted = x - torch.amax(x, dim=dim, keepdim=True)
    return (shifted - torch.log(block_sum(torch.exp(shifted), dim, keepdim=True))).to(dtype)


def mean_last(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
    """Mean over the last axis: the fixed-block sum divided by the axis length."""
    dtype = x.dtype
    out = block_sum(x.to(_compute_dtype(x)), -1, keepdim=keepdim) / x.shape[-1]
    return out.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) * weight, computed in float32 like transformers' and vLLM's native RMSNorm."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(mean_last(x * x, keepdim=True) + eps)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(dtype)


# -- counting and poisoning -------------------------------------------------------------------------------------------


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


# -- Hugging Face / aten: a dispatch mode below autograd ------------------------------------------------------------


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


def _aten_mv(a: torch.Tensor, v: torch.Tensor) -> Any:
    return mm(a, v.unsqueeze(1)).squeeze(1) if _float(a, v) else NotImplemented


def _aten_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
    out = softmax(x.float() if half_to_float else x, dim)
    return out


def _aten_log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
    return log_softmax(x.float() if half_to_float else x, dim)


def _aten_mean_dim(x: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: Any = None) -> Any:
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if dtype is not None or not x.is_floating_point() or x.ndim == 0 or [d % x.ndim for d in dims] != [x.ndim - 1]:
        return NotImplemented
    return mean_last(x, keepdim)


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
    torch.ops.aten.mv.default: _aten_mv,
    torch.ops.aten._softmax.default: _aten_softmax,
    torch.ops.aten._log_softmax.default: _aten_log_softmax,
    torch.ops.aten.mean.dim: _aten_mean_dim,
}


_COMPOSITE = frozenset({torch.ops.aten.linear.default, torch.ops.aten.matmul.default,
                        torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int})
"""Composite ops the mode may see whole (under `torch.inference_mode`, as vLLM samples) rather than as the aten
ops they decompose into; the mode decomposes them itself."""


class FixedBlockMode(TorchDispatchMode):
    """Runs the replaced aten ops with the fixed-block kernels; everything else as usual."""

    def __init__(self, ops: dict[Any, Callable[..., Any]]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _COMPOSITE:
            # Seen undecomposed (under inference mode): decompose with the mode on, so the parts come back here.
            with self:
                return func.decompose(*args, **(kwargs or {}))
        impl = self.ops.get(func)
        if impl is None and self.ops is _ATEN:
            impl = _BY_NAME.get(getattr(func, "_name", ""))
        if impl is not None:
            out = impl(*args, **(kwargs or {}))
            if out is not NotImplemented:
                return _done(out)
        return func(*args, **(kwargs or {}))


def _push_mode(ops: dict[Any, Callable[..., Any]]) -> None:
    mode = FixedBlockMode(ops)
    # Entered for good: the worker serves every call on this thread (autograd carries the mode to backward).
    mode.__enter__()
    _state["mode"] = mode


# -- vLLM (CPU): the linear layers' cpu_linear, RMSNorm, and the sampler's softmax --------------------------------


def _apply_vllm() -> None:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise RuntimeError("fixed-block: vLLM must run its engine core in this process (set "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM starts), or the patch would not be active "
                           "where the model runs")
    from vllm.model_executor.layers import layernorm
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.v1.sample import sampler as vllm_sampler

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

    def forward_native(self: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if self.variance_size_override is not None:
            raise RuntimeError("fixed-block: RMSNorm with a variance size override is not covered by this patch")
        if residual is None:
            return _done(rms_norm(x, self.weight.data if self.pass_weight else None, self.variance_epsilon))
        orig = x.dtype
        summed = x.to(torch.float32) + residual.to(torch.float32)
        normed = rms_norm(summed, self.weight.data if self.pass_weight_add else None, self.variance_epsilon)
        return _done(normed.to(orig)), summed.to(orig)

    # The sampler's softmax / log_softmax (the reported log-probabilities, for sampled and for prompt tokens) run
    # under the mode; only the sampler does, since a mode around the whole model would put every other op vLLM
    # runs through a Python call (measured: 10x slower).
    mode = FixedBlockMode({torch.ops.aten._softmax.default: _aten_softmax,
                           torch.ops.aten._log_softmax.default: _aten_log_softmax})
    sampler_forward = vllm_sampler.Sampler.forward
    compute_logprobs = vllm_sampler.Sampler.compute_logprobs

    def under_mode(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if _state["in_sampler"]:
                return fn(*args, **kwargs)
            _state["in_sampler"] = True
            try:
                with mode:
                    return fn(*args, **kwargs)
            finally:
                _state["in_sampler"] = False

        return run

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm  # type: ignore[assignment]
    layernorm.RMSNorm.forward_native = forward_native  # type: ignore[method-assign]
    vllm_sampler.Sampler.forward = under_mode(sampler_forward)  # type: ignore[method-assign]
    vllm_sampler.Sampler.compute_logprobs = staticmethod(under_mode(compute_logprobs))  # type: ignore[method-assign]
    _state["mode"] = mode


def apply(engine: str, *, poison: bool = False) -> None:
    """Install the patch in this process for `engine` ("hf" or "vllm"), before any model is loaded."""
    if _state["engine"] is not None:
        raise RuntimeError(f"{NAME}: already applied (for {_state['engine']})")
    _state["poison"] = poison
    if engine == "hf":
        _push_mode(_ATEN)
    elif engine == "vllm":
        _apply_vllm()
    else:
        raise ValueError(f"{NAME}: no implementation for engine {engine!r}; it covers hf and vllm")
    _state["engine"] = engine
