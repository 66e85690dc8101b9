"""invariant-rms-norm: one op of the batch-invariant base, `fixed-block`'s RMSNorm as a function kernel:
x / sqrt(mean(x²) + eps) * weight in float32, as transformers computes it, with the mean of squares a fixed-block
sum divided by the row length. A folder cannot import another, so each op of the base repeats `block_sum`."""

from __future__ import annotations

import torch

BLOCK = 16


def block_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (kept, size 1) in blocks of 16 anchored at the end of the axis (zero-padded at its start): a
    fixed pairwise tree in each block (slot i + slot i + h), the blocks added in order from +0, so leading zero
    blocks add +0 and a row's bits depend on its own values alone, not on the batch or its padding."""
    x = x.movedim(dim, -1)
    pad = (-x.shape[-1]) % BLOCK
    if pad:
        x = torch.cat([x.new_zeros((*x.shape[:-1], pad)), x], dim=-1)
    x = x.unflatten(-1, (x.shape[-1] // BLOCK, BLOCK))
    width = BLOCK
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:2 * width]
    x = x.squeeze(-1)
    acc = torch.zeros_like(x[..., 0])
    for j in range(x.shape[-1]):
        acc = acc + x[..., j]
    return acc.unsqueeze(-1).movedim(-1, dim)


def rms_norm(input: torch.Tensor, normalized_shape: list[int] | tuple[int, ...], weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    x = input.to(torch.float32)
    mean = block_sum(x * x, -1) / x.shape[-1]
    x = x * torch.rsqrt(mean + (torch.finfo(torch.float32).eps if eps is None else eps))
    if weight is not None:
        x = weight * x.to(weight.dtype)
    return x.to(input.dtype)
