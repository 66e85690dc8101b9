"""invariant-matmul: one op of the batch-invariant base, `fixed-block`'s matrix product as a function kernel.

Each output element is a dot product cut into blocks of 16 along the reduction axis, anchored at its end (the axis
is zero-padded at its start to whole blocks, so a left-padded batch puts its real values in the same slots), each
block summed by a fixed pairwise tree and the blocks added in order from +0: elementwise IEEE operations only, so
row i of the result depends on row i of the input and nothing else (not on the number of rows, nor on padding).
kernel.c computes the same operations in the same order; the torch operations below are used where no C compiler
builds it (same bits, slower). A folder cannot import another, so this repeats fixed-block's product.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

BLOCK = 16
CHUNK_ELEMENTS = 1 << 17
"""Largest intermediate product tensor of the torch operations (rows are processed in chunks that fit)."""
SOURCE = Path(__file__).resolve().parent / "kernel.c"
FLAGS = ("-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared")
"""No FMA contraction, no reassociation: each product and sum stays one rounded IEEE operation."""
_lib: dict[str, Any] = {}


def _build() -> ctypes.CDLL | None:
    """kernel.c built once per source, compiler and flags into the user's cache; None where it cannot be."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    flags = FLAGS
    if platform.machine() in ("x86_64", "AMD64"):
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                cpu = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        except OSError:
            cpu = []
        flags = (*flags, "-mavx2", "-mno-fma") if "avx2" in cpu else flags  # never FMA: it changes the rounding
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30,
                                 check=True).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), version.encode(), " ".join(flags).encode()])).hexdigest()
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for folder in (Path(root) / "invar" / "invariant-matmul",
                   Path(tempfile.gettempdir()) / f"invar-invariant-matmul-{os.getuid()}"):
        target = folder / f"kernel-{key[:32]}.so"
        try:
            if not target.exists():
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".kernel-", suffix=".so", dir=folder)
                os.close(fd)
                try:
                    subprocess.run([compiler, *flags, "-o", tmp, str(SOURCE)], capture_output=True, timeout=120,
                                   check=True)
                    os.replace(tmp, target)  # concurrent workers each build their own file, then rename it
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            lib = ctypes.CDLL(str(target))
        except subprocess.CalledProcessError:
            return None
        except OSError:
            continue
        p, i = ctypes.c_void_p, ctypes.c_int64
        lib.fb_bmm_f32.argtypes = [p, i, i, p, i, i, i, p, i, i, i, i, p]
        lib.fb_bmm_f32.restype = None
        return lib
    return None


def _kernel() -> ctypes.CDLL | None:
    if "lib" not in _lib:
        _lib["lib"] = _build()
    lib: ctypes.CDLL | None = _lib["lib"]
    return lib


def _left_pad(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-pad `dim` at its start to a whole number of blocks (blocks are anchored at the axis's end)."""
    pad = (-x.shape[dim]) % BLOCK
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)


def _tree(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (a power of two) by a fixed pairwise tree: slot i + slot i + h, halving each level."""
    width = x.shape[dim]
    while width > 1:
        half = width // 2
        x = x.narrow(dim, 0, half) + x.narrow(dim, half, half)
        width = half
    return x.squeeze(dim)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, M, K] @ [B, K, N] in float32, every element a fixed-block dot product."""
    a, b = _left_pad(a, 2), _left_pad(b, 1)
    batch, rows, k = a.shape
    n = b.shape[2]
    lib = _kernel()
    if lib is not None:
        if k and a.stride(2) != 1:
            a = a.contiguous()
        out = torch.empty((batch, rows, n), dtype=torch.float32)
        if batch and rows and n:
            scratch = torch.empty(max(k, 1) * 16, dtype=torch.float32)
            lib.fb_bmm_f32(a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0), b.stride(1),
                           b.stride(2), out.data_ptr(), batch, rows, k, n, scratch.data_ptr())
        return out
    blocks = k // BLOCK
    out = torch.zeros((batch, rows, n), dtype=torch.float32)
    a_blocks = a.permute(2, 0, 1).reshape(blocks, BLOCK, batch, rows, 1)
    b_blocks = b.permute(1, 0, 2).reshape(blocks, BLOCK, batch, 1, n)
    step = max(1, CHUNK_ELEMENTS // max(1, BLOCK * batch * n))
    for start in range(0, rows, step):
        acc = torch.zeros((batch, min(step, rows - start), n), dtype=torch.float32)
        for j in range(blocks):  # blocks in order from +0, so leading zero blocks add +0
            acc = acc + _tree(a_blocks[j, :, :, start:start + step] * b_blocks[j], 0)
        out[:, start:start + step] = acc
    return out


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.matmul` for float32 operands of 2 or more dimensions (leading dimensions broadcast)."""
    if a.ndim < 2 or b.ndim < 2:
        return torch.matmul(a, b)  # vectors: not on a transformer's path
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = a.float().expand(*lead, m, k).reshape(-1, m, k)
    b3 = b.float().expand(*lead, k, n).reshape(-1, k, n)
    return _bmm(a3, b3).reshape(*lead, m, n).to(a.dtype)
