"""A silent precision downgrade: the softmax is computed in bfloat16 and returned as float32 (a documented hack class
of agent-written kernels; an allclose test at 1e-2 accepts it)."""

import torch


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    out_dtype = input.dtype if dtype is None else dtype
    return torch.softmax(input.to(torch.bfloat16), dim=dim).to(out_dtype)
