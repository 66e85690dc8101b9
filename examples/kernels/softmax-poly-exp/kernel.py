"""An approximated transcendental: a softmax whose exponential is the classic fast approximation
exp(x) ≈ (1 + x/256)^256 (eight squarings), clamped at x ≥ -256 where the base would go negative. The row maximum is
subtracted first, so every argument is ≤ 0; the error grows with |x| (about x²/512 relative), small on the large
probabilities and larger on the small ones: an allclose at 1e-2 passes it."""

import torch


def _exp(x: torch.Tensor) -> torch.Tensor:
    y = 1.0 + x.clamp(min=-256.0) / 256.0
    for _ in range(8):
        y = y * y
    return y


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    x = input if dtype is None else input.to(dtype)
    e = _exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
