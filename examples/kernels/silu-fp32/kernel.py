"""A correct elementwise SiLU in float32: x * sigmoid(x)."""

import torch


def silu(input: torch.Tensor) -> torch.Tensor:
    return input * torch.sigmoid(input)
