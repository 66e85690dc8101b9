"""A correct, batch-invariant softmax in float32: every row is reduced on its own."""

import torch


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    x = input if dtype is None else input.to(dtype)
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)
