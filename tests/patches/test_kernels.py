"""The patches' kernels on their own (torch only, no engine): split-k varies with the number of rows, fixed-block
does not, and both stay within float rounding of stock torch; fixed-block's compiled kernel has the bits of its
torch operations."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from patch_helpers import load_patch

ROWS = [1, 2, 3, 7, 16, 33, 64]


@pytest.fixture(scope="module")
def split_k() -> ModuleType:
    return load_patch("split-k")


@pytest.fixture(scope="module")
def fixed_block() -> ModuleType:
    return load_patch("fixed-block")


def _data(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


# -- split-k: batch variant, allclose -----------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "n"), [(128, 128), (128, 384), (384, 128), (32, 64)])
def test_split_k_is_close_to_torch_but_a_row_alone_differs_from_the_same_row_in_a_batch(
        split_k: ModuleType, k: int, n: int) -> None:
    a, b = _data(64, k, seed=1), _data(k, n, seed=2)
    full = split_k.mm(a, b)
    torch.testing.assert_close(full, a @ b, rtol=1e-5, atol=1e-4)
    differing = [m for m in ROWS[1:] if not _bits_equal(split_k.mm(a[:1], b), split_k.mm(a[:m], b)[:1])]
    assert differing, f"split-k gave row 0 the same bits for every batch size {ROWS} (K={k}, N={n})"


def test_split_k_chunk_count_falls_as_rows_grow(split_k: ModuleType) -> None:
    counts = [split_k.splits(m, 128) for m in (1, 8, 9, 16, 17, 64, 65, 1000)]
    assert counts == [8, 8, 4, 4, 2, 2, 1, 1]
    assert split_k.splits(1, 3) == 3, "never more chunks than K"


# -- fixed-block: batch invariant ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "n"), [(128, 128), (128, 384), (384, 128), (32, 18), (50, 7)])
def test_fixed_block_matmul_rows_do_not_depend_on_the_batch(fixed_block: ModuleType, k: int, n: int) -> None:
    a, b = _data(64, k, seed=3), _data(k, n, seed=4)
    full = fixed_block.mm(a, b)
    torch.testing.assert_close(full, a @ b, rtol=1e-5, atol=1e-4)
    for m in ROWS:
        assert _bits_equal(fixed_block.mm(a[:m], b), full[:m]), f"rows 0..{m - 1} alone differ from the batch of 64"
    order = torch.randperm(64, generator=torch.Generator().manual_seed(5))
    assert _bits_equal(fixed_block.mm(a[order], b), full[order]), "reordering rows changed their bits"


def test_fixed_block_bmm_is_batch_and_left_padding_invariant(fixed_block: ModuleType) -> None:
    """Attention's product with V: extra key positions at the start with weight exactly 0 change nothing."""
    weights = torch.softmax(_data(8, 5, 11, seed=6), dim=-1)
    values = _data(8, 11, 32, seed=7)
    out = fixed_block.bmm(weights, values)
    torch.testing.assert_close(out, weights @ values, rtol=1e-5, atol=1e-6)
    for m in ROWS[:5]:
        assert _bits_equal(fixed_block.bmm(weights[:, :m], values), out[:, :m])
    for pad in (1, 5, 16, 21):
        padded_w = torch.cat([torch.zeros(8, 5, pad), weights], dim=-1)
        padded_v = torch.cat([_data(8, pad, 32, seed=pad), values], dim=1)
        assert _bits_equal(fixed_block.bmm(padded_w, padded_v), out), f"{pad} leading zero-weight keys moved bits"


def test_fixed_block_softmax_and_log_softmax_are_row_and_padding_invariant(fixed_block: ModuleType) -> None:
    x = _data(64, 37, seed=8) * 4
    for fn, ref in ((fixed_block.softmax, torch.softmax), (fixed_block.log_softmax, torch.log_softmax)):
        full = fn(x, -1)
        torch.testing.assert_close(full, ref(x, -1), rtol=1e-5, atol=1e-6)
        for m in ROWS:
            assert _bits_equal(fn(x[:m], -1), full[:m])
    # A masked (padded) position holds the dtype's minimum, as transformers' eager attention mask adds it.
    masked = torch.cat([torch.full((64, 9), torch.finfo(torch.float32).min), x], dim=-1)
    assert _bits_equal(fixed_block.softmax(masked, -1)[:, 9:], fixed_block.softmax(x, -1))


def test_fixed_block_rms_norm_is_row_invariant_and_close_to_the_native_formula(fixed_block: ModuleType) -> None:
    x, w = _data(64, 128, seed=9), _data(128, seed=10)
    full = fixed_block.rms_norm(x, w, 1e-6)
    native = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(full, native, rtol=1e-5, atol=1e-6)
    for m in ROWS:
        assert _bits_equal(fixed_block.rms_norm(x[:m], w, 1e-6), full[:m])


def test_fixed_block_bfloat16_inputs_are_computed_in_float32_and_rounded_once(fixed_block: ModuleType) -> None:
    a, b = _data(16, 128, seed=11).bfloat16(), _data(128, 64, seed=12).bfloat16()
    out = fixed_block.mm(a, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)
    assert _bits_equal(fixed_block.mm(a[:3], b).float(), out[:3].float())


# -- fixed-block's compiled kernel: the torch operations' bits, faster --------------------------------------------


def _hard_values(*shape: int, seed: int) -> torch.Tensor:
    """Magnitudes over ~30 orders, with ±0, a subnormal, ±inf and NaN sprinkled in: every rounding and special case
    a reordered or fused sum would show."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 4)
    flat = x.view(-1)
    if not flat.numel():
        return x
    specials = torch.tensor([0.0, -0.0, 1e-40, -3e-39, float("inf"), -float("inf"), float("nan"), 3e38])
    where = torch.randint(0, flat.numel(), (min(max(flat.numel() // 50, 1), 64),), generator=g)
    flat[where] = specials[torch.arange(where.numel()) % specials.numel()]
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(ints[a.dtype]),
                                                                      b.contiguous().view(ints[b.dtype]))


def test_fixed_block_kernel_is_built_here(fixed_block: ModuleType) -> None:
    """The suite's machines have a C compiler: the products below are the compiled kernel's, not the fallback."""
    assert fixed_block.implementation().startswith("kernel.c built by"), fixed_block.implementation()
    assert "-ffp-contract=off" in fixed_block.implementation()


@pytest.mark.parametrize(("batch", "m", "k", "n"), [
    (1, 1, 1, 1), (1, 3, 5, 7), (2, 4, 16, 16), (1, 7, 17, 33), (3, 5, 64, 10), (1, 37, 576, 100),
    (1, 2, 1536, 24), (2, 1, 0, 5), (1, 4, 31, 1), (4, 9, 200, 70), (2, 3, 15, 9), (1, 16, 48, 8)])
@pytest.mark.parametrize("layout", ["contiguous", "weight-transposed", "expanded", "strided"])
def test_fixed_block_kernel_gives_the_torch_operations_bits(fixed_block: ModuleType, batch: int, m: int, k: int,
                                                            n: int, layout: str) -> None:
    """`bmm` through kernel.c against `bmm_torch` (the patch's reference), bit for bit, for every layout of B the
    engines pass: a linear layer's weight (transposed), attention's V, a broadcast batch, a strided slice."""
    a = _hard_values(batch, m, k, seed=m * 1000 + k)
    if layout == "weight-transposed":
        b = _hard_values(batch, n, k, seed=n).transpose(1, 2)
    elif layout == "expanded":
        b = _hard_values(1, k, n, seed=n).expand(batch, k, n)
    elif layout == "strided":
        b = _hard_values(batch, k, 2 * n, seed=n)[:, :, ::2]
        a = _hard_values(batch, m, 2 * k, seed=k)[:, :, 1::2]  # a not unit-stride along K: copied first
    else:
        b = _hard_values(batch, k, n, seed=n)
    compiled = fixed_block._bmm_c(fixed_block._kernel(), a, b)
    assert _same_bits(compiled, fixed_block.bmm_torch(a, b))
    assert _same_bits(fixed_block.bmm(a, b), compiled), "bmm does not dispatch to the kernel"


def test_fixed_block_kernel_rounds_half_precision_inputs_as_the_torch_operations_do(fixed_block: ModuleType) -> None:
    for dtype in (torch.bfloat16, torch.float16):
        a, b = _data(2, 5, 40, seed=17).to(dtype), _data(2, 40, 9, seed=18).to(dtype)
        assert _same_bits(fixed_block._bmm_c(fixed_block._kernel(), a, b), fixed_block.bmm_torch(a, b))


@pytest.mark.parametrize(("shape", "dim"), [((3, 49152), -1), ((2, 5, 576), -1), ((4, 7), 0), ((2, 3, 33), 1),
                                            ((1, 1), -1), ((6, 16), -1)])
def test_fixed_block_kernel_row_sums_give_the_torch_operations_bits(fixed_block: ModuleType, shape: tuple[int, ...],
                                                                    dim: int) -> None:
    x = _hard_values(*shape, seed=len(shape) * 7 + shape[dim])
    for keepdim in (False, True):
        compiled = fixed_block._block_sum_c(fixed_block._kernel(), x, dim, keepdim)
        assert _same_bits(compiled, fixed_block.block_sum_torch(x, dim, keepdim))


def test_without_a_c_compiler_the_torch_operations_compute_the_same_bits(fixed_block: ModuleType,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _data(1, 6, 70, seed=19), _data(1, 70, 12, seed=20)
    compiled = fixed_block.bmm(a, b)
    monkeypatch.setitem(fixed_block._state, "implementation", None)
    monkeypatch.setitem(fixed_block._state, "kernel", None)
    monkeypatch.setattr(fixed_block.shutil, "which", lambda name: None)
    assert fixed_block.implementation() == "torch operations (no C compiler on PATH to build kernel.c)"
    assert _same_bits(fixed_block.bmm(a, b), compiled)


# -- the dispatch modes: what a worker installs --------------------------------------------------------------------


def test_fixed_block_mode_replaces_products_softmax_and_rms_mean_with_and_without_inference_mode(
        fixed_block: ModuleType) -> None:
    """Under `torch.inference_mode` (vLLM's sampler) the mode sees softmax and linear whole; it decomposes them."""
    x, w = _data(5, 18, seed=13), _data(7, 18, seed=14)
    mode = fixed_block.FixedBlockMode(fixed_block._ATEN)
    fixed_block.reset_calls()
    with mode, torch.inference_mode():
        inference = (torch.nn.functional.linear(x, w), x.log_softmax(dim=-1, dtype=torch.float32), x.softmax(-1))
    assert fixed_block.calls() == 3
    with mode, torch.no_grad():
        no_grad = (torch.nn.functional.linear(x, w), x.log_softmax(dim=-1, dtype=torch.float32), x.softmax(-1),
                   x.pow(2).mean(-1, keepdim=True), x.mean(0))
    assert fixed_block.calls() == 3 + 4, "mean over a leading axis is not RMSNorm's and stays stock"
    expected = (fixed_block.linear(x, w), fixed_block.log_softmax(x), fixed_block.softmax(x),
                fixed_block.mean_last(x.pow(2), True), x.mean(0))
    for got in (inference, no_grad):
        for g, e in zip(got, expected, strict=False):
            assert _bits_equal(g, e)


def test_poison_flips_the_last_mantissa_bit_of_every_replaced_result(split_k: ModuleType) -> None:
    a, b = _data(4, 32, seed=15), _data(32, 8, seed=16)
    clean = split_k.mm(a, b)
    split_k._state["poison"] = True
    try:
        with split_k.SplitKMode():
            poisoned = a @ b
    finally:
        split_k._state["poison"] = False
    assert torch.equal(poisoned.view(torch.int32) ^ clean.view(torch.int32), torch.ones_like(clean, dtype=torch.int32))
