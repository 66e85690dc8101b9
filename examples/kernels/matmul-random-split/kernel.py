"""A nondeterministic reduction order: a "split-K" matmul that splits the inner dimension at a point drawn afresh on
every call (the way a kernel picks a split from a work queue or a timer) and adds the two partial products. Each
result is a correct float32 product up to rounding (an allclose at 1e-4 passes it), but which rounding depends on the
draw, not on the inputs: the same input gives different bits from call to call."""

import random

import torch

_draw = random.Random()  # seeded from the operating system: a different split order in every process


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[-1]
    if k < 2:
        return torch.matmul(a, b)
    split = _draw.randrange(1, k)
    return torch.matmul(a[..., :split], b[..., :split, :]) + torch.matmul(a[..., split:], b[..., split:, :])
