"""A correct softmax in float32. Every row is reduced on its own, but `sum`'s rounding depends on the row's length,
so a row lengthened by left padding can change bits: correct, batch-variant."""

import torch


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    x = input if dtype is None else input.to(dtype)
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)
