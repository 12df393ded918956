"""The FP8 reference (``ioattn.reference.fp8``), the oracle twin of the FP8 kernels: the Walsh–Hadamard
transform and the shared random rotation (orthogonal, Q Kᵀ unchanged, outliers spread), e4m3
quantisation per tensor / head / block (round trips within e4m3's precision, saturation, no NaN),
and FP8 attention against the float64 reference."""
import math

import pytest
import torch

from ioattn.reference import fp8
from ioattn.reference.naive import attention_ref

F64 = torch.float64
# e4m3 keeps 3 mantissa bits: a normal value rounds within half an ulp, 2^-4 of its magnitude; below
# the smallest normal (2^-6) the subnormal step is 2^-9, so the absolute error stays within 2^-10
E4M3_REL, E4M3_SUB = 2.0 ** -4, 2.0 ** -10


def _normal(*shape, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("d", [1, 2, 8, 64, 128, 256])
def test_hadamard_is_orthogonal_symmetric_and_fwht_applies_it(d):
    h = fp8.hadamard(d)
    eye = torch.eye(d, dtype=F64)
    torch.testing.assert_close(h @ h.T, eye, rtol=0, atol=1e-12)
    torch.testing.assert_close(h, h.T, rtol=0, atol=0)
    x = _normal(3, 5, d)
    torch.testing.assert_close(fp8.fwht(x), x @ h, rtol=0, atol=1e-12)
    torch.testing.assert_close(fp8.fwht(fp8.fwht(x)), x, rtol=0, atol=1e-12)  # its own inverse


@pytest.mark.parametrize("d", [0, 3, 96, 192])
def test_hadamard_refuses_other_head_dims(d):
    with pytest.raises(ValueError, match=f"power-of-two head dim, got {d}"):
        fp8.hadamard(d)
    with pytest.raises(ValueError, match=f"power-of-two head dim, got {d}"):
        fp8.fwht(torch.zeros(2, d))


def test_shared_rotation_keeps_qk_and_spreads_an_outlier():
    d = 128
    signs = fp8.random_signs(d, seed=7)
    assert set(signs.tolist()) == {-1.0, 1.0} and torch.equal(signs, fp8.random_signs(d, seed=7))
    q, k = _normal(2, 16, 4, d, seed=1), _normal(2, 16, 4, d, seed=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
    rotated = torch.einsum("bqhd,bkhd->bhqk", fp8.rotate(q, signs), fp8.rotate(k, signs))
    torch.testing.assert_close(rotated, scores, rtol=0, atol=1e-10)
    # one outlier channel becomes d entries of equal magnitude
    x = torch.zeros(d, dtype=F64)
    x[5] = 100.0
    torch.testing.assert_close(fp8.rotate(x, signs).abs(), torch.full((d,), 100.0 / math.sqrt(d), dtype=F64))


@pytest.mark.parametrize("granularity, descale_shape", [("tensor", ()), ("head", (2, 4)), ("block", (2, 4, 3))])
def test_quantize_round_trip_within_e4m3_precision(granularity, descale_shape):
    x = _normal(2, 300, 4, 64, seed=3) * torch.linspace(0.01, 20.0, 4, dtype=F64)[None, None, :, None]
    values, descale = fp8.quantize_fp8_ref(x, granularity, block_rows=128)
    assert values.dtype == torch.float8_e4m3fn and values.shape == x.shape
    assert tuple(descale.shape) == descale_shape and descale.dtype == torch.float32
    back = fp8.dequantize_fp8_ref(values, descale, block_rows=128)
    assert not back.isnan().any()
    scale = fp8.dequantize_fp8_ref(torch.ones_like(values), descale, block_rows=128)  # each element's descale
    bound = torch.maximum(x.abs() * E4M3_REL, scale * E4M3_SUB) * (1 + 1e-6)
    assert ((back - x).abs() <= bound).all()
    # each group's largest magnitude lands on e4m3's largest value
    assert values.to(F64).abs().max().item() == fp8.E4M3_MAX


def test_quantize_zeros_and_saturation_never_nan():
    values, descale = fp8.quantize_fp8_ref(torch.zeros(1, 8, 2, 16), "head")
    assert torch.equal(descale, torch.ones(1, 2)) and not values.to(F64).any()
    p = torch.tensor([[1e6, 448.0, 1.0, 1e-9]], dtype=F64)
    out = fp8.quantize_p(p, scale=1.0)
    assert not out.isnan().any() and out[0, 0].item() == fp8.E4M3_MAX
    with pytest.raises(ValueError, match="granularity must be one of"):
        fp8.quantize_fp8_ref(torch.zeros(1, 8, 2, 16), "row")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_fp8_attention_within_a_half_ulp_of_the_output(causal, granularity):
    """Per-head FP8 q, k, v and e4m3 P against float64 attention of the unquantised inputs: the RMS error
    at most 2^-4 of the output's RMS (each factor rounds within half an e4m3 ulp); GQA 2."""
    q = _normal(2, 200, 4, 64, seed=4)
    k, v = _normal(2, 256, 2, 64, seed=5), _normal(2, 256, 2, 64, seed=6)
    ref, _ = attention_ref(q, k, v, window=(-1, 0) if causal else (-1, -1))
    quant = [fp8.quantize_fp8_ref(t, granularity) for t in (q, k, v)]
    out = fp8.attention_fp8_ref(*(t for t, _ in quant), *(s for _, s in quant), causal=causal)
    assert not out.isnan().any()
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(out - ref) <= E4M3_REL * rms(ref)


def test_rotation_lowers_the_error_of_outlier_inputs():
    """FlashAttention-3's setting: N(0, 1) plus rare N(0, 10) outliers, per-tensor scales: the shared
    rotation lowers the FP8 attention's RMS error."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 256, 4, 64, dtype=F64, generator=g) for _ in range(3))
    for t in (q, k, v):
        t += (torch.rand(t.shape, generator=g, dtype=F64) < 0.001) * torch.randn(t.shape, generator=g, dtype=F64) * 10
    ref, _ = attention_ref(q, k, v)
    signs = fp8.random_signs(64, seed=9)

    def rmse(qq, kk):
        quant = [fp8.quantize_fp8_ref(t, "tensor") for t in (qq, kk, v)]
        out = fp8.attention_fp8_ref(*(t for t, _ in quant), *(s for _, s in quant))
        return (out - ref).pow(2).mean().sqrt().item()
    assert rmse(fp8.rotate(q, signs), fp8.rotate(k, signs)) < 0.8 * rmse(q, k)
