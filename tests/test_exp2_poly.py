"""The Gluon forward's exp2 on the FMA units (``hopper.exp2_fma``; the kernel's ``_exp2_poly``) through
its float32 twin ``ioattn.reference.exp2_poly``, on the CPU: the error bound on a dense grid, the
special values, the constants against their fit and the kernel's, and the attention it gives against
the float64 oracle with the GPU tests' criterion (2x PyTorch's own error)."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_within_torch_error
from ioattn.masks import keep_mask
from ioattn.reference import attention_ref
from ioattn.reference.exp2_poly import C1, C2, C3, MAX_REL_ERROR, ROUND, exp2_poly, fit_exp2_cubic

LOG2E = 1.4426950408889634


def _rel_err(x):
    return (exp2_poly(x).double() / torch.exp2(x.double()) - 1).abs()


def test_exp2_poly_error_bound():
    """Max relative error <= MAX_REL_ERROR on [-126, 0]: a dense grid (spacing ~3e-5, so every
    float32 rounding case of the integer part: ties, both sides of each half-integer), every integer
    (exact) and half-integer, and values within a few ulps of them."""
    grid = torch.linspace(-126.0, 0.0, 4_000_001, dtype=torch.float64).float()
    ints = torch.arange(-126, 1, dtype=torch.float32)
    halves = ints[1:] - 0.5
    near = torch.cat([torch.nextafter(t, t + d) for t in (ints[1:], halves) for d in (-1.0, 1.0)])
    near = near[(near >= -126) & (near <= 0)]
    for x in (grid, halves, near):
        assert _rel_err(x).max().item() <= MAX_REL_ERROR
    assert torch.equal(exp2_poly(ints), torch.exp2(ints))  # 2**n exactly: the cubic is 1 at f = 0
    # the bound is tight: the grid reaches 99 % of it (the cubic's equioscillation)
    assert _rel_err(grid).max().item() > 0.99 * 1.013e-4


def test_exp2_poly_special_values():
    """0 -> exactly 1; -inf (masked scores), -127 and below -> exactly 0, no NaN; (-127, -126): a
    subnormal below 2**-126 (MUFU.EX2's flush-to-zero gives 0); small positive arguments (a
    rounded row maximum a few ulps under a score) within the bound."""
    one = exp2_poly(torch.tensor([0.0, -0.0]))
    assert torch.equal(one, torch.ones(2))
    low = torch.tensor([float("-inf"), -127.0, -127.25, -127.5, -128.0, -200.0, -1e30, torch.finfo(torch.float32).min])
    assert torch.equal(exp2_poly(low), torch.zeros_like(low))
    mid = torch.linspace(-127.0, -126.0, 10001)[1:-1]
    y = exp2_poly(mid)
    assert not y.isnan().any() and (y >= 0).all() and (y < 2.0 ** -126).all()
    pos = torch.linspace(0.0, 0.5, 100001)
    assert _rel_err(pos).max().item() <= MAX_REL_ERROR


def test_exp2_poly_constants():
    """The cubic's coefficients are its fit (``fit_exp2_cubic``, to float32 precision), the rounding
    constant is 1.5 * 2**23, and the Gluon kernel uses the same values."""
    (c1, c2, c3), err = fit_exp2_cubic()
    assert err < 1.014e-4
    for got, fit in zip((C1, C2, C3), (c1, c2, c3)):
        assert abs(got - fit) < 1e-6
        assert torch.tensor(got, dtype=torch.float32).item() == got  # exactly a float32 value
    assert ROUND == 1.5 * 2 ** 23
    hf = pytest.importorskip("ioattn.kernels.hopper_softmax")
    assert (hf.EXP2_C1.value, hf.EXP2_C2.value, hf.EXP2_C3.value, hf.EXP2_ROUND.value) == (C1, C2, C3, ROUND)


def _kernel_like_forward(q, k, v, causal, fma_cols, block_n=128):
    """The Gluon forward's arithmetic in one pass (one key tile per block_n keys): S in float32,
    log2 domain, exp2 of each tile's last ``fma_cols`` columns by the polynomial and of the rest by
    torch.exp2 (MUFU.EX2's stand-in), P rounded to the input dtype for P V, normalised by the
    float32 row sum; rows with no key give 0."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    s = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * (LOG2E / math.sqrt(d))
    if causal:
        s = s.masked_fill(~keep_mask(sq, sk, (-1, 0)), float("-inf"))
    m = s.amax(-1, keepdim=True)
    x = s - torch.where(m == float("-inf"), 0.0, m)
    on_fma = (torch.arange(sk) % block_n) >= block_n - fma_cols
    p = torch.where(on_fma, exp2_poly(x), torch.exp2(x))
    l_sum = p.sum(-1, keepdim=True)
    o = torch.einsum("bhij,bjhd->bihd", p.to(q.dtype).float(), v.float())
    return (o / torch.where(l_sum == 0, 1.0, l_sum).transpose(1, 2)).to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("share", [25, 50, 100])
@pytest.mark.parametrize("scale", [1.0, 12.0])  # 12: peaked rows, exponent arguments far below -127
def test_exp2_poly_attention_within_torch_error(dtype, causal, share, scale):
    """With ``share`` % of every key tile's exponentials on the polynomial, the output meets the GPU
    tests' criterion against the float64 oracle (causal: the last query rows see fewer keys than
    the first tile; 300 queries over 200 keys leave rows with no key at all, which must give 0)."""
    gen = torch.Generator().manual_seed(int(share * 10 + causal + scale))
    b, sq, sk, h, d = 2, 300, 200, 2, 64
    q = (torch.randn(b, sq, h, d, generator=gen) * scale).to(dtype)
    k, v = (torch.randn(b, sk, h, d, generator=gen).to(dtype) for _ in range(2))
    out = _kernel_like_forward(q, k, v, causal, 128 * share // 100)
    window = (-1, 0) if causal else (-1, -1)
    ref, _ = attention_ref(q, k, v, window=window)
    same, _ = attention_ref(q, k, v, window=window, upcast=False)
    assert_within_torch_error("out", out, ref, same)
    if causal:
        assert torch.equal(out[:, : sq - sk], torch.zeros_like(out[:, : sq - sk]))
    if scale > 1:  # some exponent arguments below -127: p = 0 there, exactly
        s = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * (LOG2E / math.sqrt(d))
        assert (s - s.amax(-1, keepdim=True) < -127).any()
