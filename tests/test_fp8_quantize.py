"""``ioattn.quantize_fp8`` (the kernel of ``ioattn.kernels.quantize``, under the interpreter without
a GPU, and the PyTorch path) against the float64 oracle: rotary (``apply_rotary_ref``) and the
rotation (``reference.fp8.rotate``) in float64, then ``quantize_fp8_ref``.

Tolerances, from e4m3's precision (3 mantissa bits) and float32's (2^-24):
* values: within one e4m3 ulp of the oracle's, 2^(e - 3) for a magnitude in [2^e, 2^(e + 1)) and
  2^-9 below 2^-6 (the kernel's float32 rotation may move a value across a rounding midpoint);
* descales: the oracle's to float32 rounding, relative ``(log2 d + 3) sqrt(d) 2^-24`` with a rotation
  (each rotated feature goes through log2 d + 3 float32 roundings of sums bounded by the row's L1
  norm, at most sqrt(d) times the amax); bit-equal without one, the input being exact in float32;
* round trip: |values * descale - x'| <= 2^-4 |x'| + 2^-10 descale (half an ulp, relative 2^-4
  for normal values, 2^-9 / 2 below them), plus twice the float32 slack above.
"""
import math

import pytest
import torch
from conftest import DEVICE, _PoisonedTorch, rotary_tables

import ioattn
import ioattn.launch.quantize
from ioattn.fp8 import quantize_fp8
from ioattn.plan import dispatch
from ioattn.reference import fp8
from ioattn.reference.decode import apply_rotary_ref

I32 = torch.int32
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
GRANULARITIES = ["tensor", "head", "block"]


@pytest.fixture
def poison(monkeypatch):
    """The launch's buffers (values, descales, amaxes) start as NaN: an unwritten element shows."""
    monkeypatch.setattr(ioattn.launch.quantize, "torch", _PoisonedTorch("torch"))


pytestmark = pytest.mark.usefixtures("one_thread", "poison")


def _rtol(d, rotated):
    return (math.log2(d) + 3) * math.sqrt(d) * 2.0 ** -24 if rotated else 0.0


def _x(shape, dtype, scale_heads=True):
    """Random input with heads of very different magnitudes (never zeros)."""
    x = torch.randn(*shape)
    if scale_heads:
        x = x * torch.logspace(-2, 1, shape[-2])[:, None]
    return x.to(dtype).to(DEVICE)


def _rotated64(x, seed, rotary, interleaved, positions):
    """x' in float64: the rotary embedding at ``positions``, then the shared rotation."""
    x64 = x.double()
    if rotary is not None:
        x64 = apply_rotary_ref(x64, *rotary, positions, interleaved)
    if seed is not None:
        x64 = fp8.rotate(x64, fp8.random_signs(x.shape[-1], seed).to(x.device))
    return x64


def _oracle(x, granularity, block_rows=128, seed=None, rotary=None, interleaved=False):
    """(values, descale, x') of a (batch, seqlen, heads, d) input."""
    positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
    xr = _rotated64(x, seed, rotary, interleaved, positions)
    values, descale = fp8.quantize_fp8_ref(xr, granularity, block_rows)
    return values, descale, xr


def _ulp(v):
    return torch.exp2(torch.floor(torch.log2(v.abs().clamp(min=2.0 ** -6))) - 3)


def _check(name, values, descale, ref_values, ref_descale, xr, deq_descale, rtol):
    """Descales to float32 rounding, values within one e4m3 ulp and, given x' (``xr``), the round trip
    within half an ulp. ``deq_descale``: the kernel's descale broadcast to ``xr``'s shape."""
    assert values.dtype == torch.float8_e4m3fn and values.shape == ref_values.shape, name
    assert descale.dtype == torch.float32 and descale.shape == ref_descale.shape, name
    got, ref = values.double(), ref_values.double()
    assert not torch.isnan(got).any() and not torch.isnan(descale).any(), f"{name}: NaN"
    torch.testing.assert_close(descale, ref_descale, rtol=rtol, atol=0, msg=f"{name}: descale")
    off = (got - ref).abs() > _ulp(torch.maximum(got.abs(), ref.abs()))
    assert not off.any(), f"{name}: {int(off.sum())} values off by more than one e4m3 ulp"
    if xr is None:
        return
    s = deq_descale.double()
    bound = 2.0 ** -4 * xr.abs() + 2.0 ** -10 * s + 2 * rtol * fp8.E4M3_MAX * s
    excess = ((got * s - xr).abs() - bound).max().item()
    assert excess <= 0, f"{name}: round-trip error above the bound by {excess:.3e}"


def _broadcast(descale, shape, block_rows):
    """A descale of ``quantize_fp8_ref``'s shapes, broadcast to (batch, seqlen, heads, d)."""
    return fp8.dequantize_fp8_ref(torch.ones(shape, dtype=torch.float64, device=descale.device),
                                  descale, block_rows)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_matches_reference(granularity, hadamard, dtype):
    x = _x((2, 70, 3, 64), dtype)  # 3 tiles of rows per (batch, head) in the two-pass modes
    seed = 5 if hadamard else None
    values, descale = quantize_fp8(x, granularity, hadamard=hadamard, seed=5, block_rows=16)
    ref_values, ref_descale, xr = _oracle(x, granularity, 16, seed)
    _check(f"{granularity} hadamard={hadamard} {dtype}", values, descale, ref_values, ref_descale, xr,
           _broadcast(descale, x.shape, 16), _rtol(64, hadamard))
    if not hadamard:  # nothing rounded before the quantisation: the same bits as the reference
        assert torch.equal(descale, ref_descale) and torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))


@pytest.mark.interpreter
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("hadamard, rotary_dim, granularity", [(False, 16, "block"), (True, 32, "head"),
                                                               (True, 8, "tensor")])
def test_rotary_matches_reference(granularity, rotary_dim, hadamard, interleaved):
    x = _x((2, 21, 2, 32), torch.float16)
    cos, sin, _ = rotary_tables(24, rotary_dim, device=DEVICE)
    seed = 3 if hadamard else None
    values, descale = quantize_fp8(x, granularity, hadamard=hadamard, seed=3, block_rows=8, rotary_cos=cos,
                                   rotary_sin=sin, rotary_interleaved=interleaved)
    ref_values, ref_descale, xr = _oracle(x, granularity, 8, seed, (cos, sin), interleaved)
    _check(f"rotary {rotary_dim} interleaved={interleaved}", values, descale, ref_values, ref_descale, xr,
           _broadcast(descale, x.shape, 8), _rtol(32, True))


def _packed_oracle(x, cu, granularity, block_rows, seed, rotary, interleaved):
    """The oracle of packed rows: one sequence at a time (per tensor: all rows as one sequence, each
    rotated at its position in its own sequence). Returns (values, descale, x', descale per row)."""
    bounds = list(zip(cu, cu[1:]))
    positions = torch.cat([torch.arange(e - s) for s, e in bounds]).to(x.device)[None]
    xr = _rotated64(x[None], seed, rotary, interleaved, positions)[0]
    if granularity == "tensor":
        values, descale = fp8.quantize_fp8_ref(xr[None], "tensor")
        return values[0], descale, xr
    blocks = -(-max(e - s for s, e in bounds) // block_rows)
    descale = torch.ones(len(bounds), x.shape[1], *((blocks,) if granularity == "block" else ()), device=x.device)
    values = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    for b, (s, e) in enumerate(bounds):
        if e > s:
            v, part = fp8.quantize_fp8_ref(xr[s:e][None], granularity, block_rows)
            values[s:e] = v[0]
            descale[b][..., :part.shape[-1]] = part[0]
    return values, descale, xr


def _packed_rows(descale, cu, granularity, block_rows, shape):
    """A packed call's descale broadcast to its (total, heads, d) rows."""
    rows = torch.empty(shape, dtype=torch.float64, device=descale.device)
    for b, (s, e) in enumerate(zip(cu, cu[1:])):
        d = descale if granularity == "tensor" else descale[b:b + 1]
        if granularity == "block":
            d = d[..., :-(-(e - s) // block_rows)]
        rows[s:e] = _broadcast(d, (1, e - s) + tuple(shape[1:]), block_rows)[0]
    return rows


@pytest.mark.interpreter
@pytest.mark.parametrize("hadamard, rotary", [(False, False), (True, True)])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_packed_sequences(granularity, hadamard, rotary):
    """Sequences of 5, 0, 35 and 17 rows: per (sequence, head) and per block of each sequence (blocks
    counted from its start; descale 1 past its end and for the empty one). Two tiles of rows for the
    longest in the two-pass modes."""
    cu = [0, 5, 5, 40, 57]
    x = _x((57, 3, 64), torch.bfloat16)
    tables = rotary_tables(40, 16, device=DEVICE)[:2] if rotary else None
    kw = dict(rotary_cos=tables[0], rotary_sin=tables[1]) if rotary else {}
    values, descale = quantize_fp8(x, granularity, hadamard=hadamard, seed=9, block_rows=8,
                                   cu_seqlens=torch.tensor(cu, dtype=I32, device=DEVICE), **kw)
    ref_values, ref_descale, xr = _packed_oracle(x, cu, granularity, 8, 9 if hadamard else None, tables, False)
    _check(f"packed {granularity}", values, descale, ref_values, ref_descale, xr,
           _packed_rows(descale, cu, granularity, 8, x.shape), _rtol(64, hadamard or rotary))


@pytest.mark.interpreter
@pytest.mark.parametrize("packed", [False, True])
def test_torch_path_matches_the_kernel(packed):
    """The PyTorch path (CPU tensors without the interpreter) gives the kernel's results."""
    x = _x((19, 2, 16) if packed else (2, 19, 2, 16), torch.float16)
    cos, sin, _ = rotary_tables(19, 8, device=DEVICE)
    kw = dict(hadamard=True, seed=1, block_rows=4, rotary_cos=cos, rotary_sin=sin,
              cu_seqlens=torch.tensor([0, 7, 19], dtype=I32, device=DEVICE) if packed else None)
    for granularity in GRANULARITIES:
        values, descale = quantize_fp8(x, granularity, **kw)
        with dispatch.forced_backend("reference"):
            ref_values, ref_descale = quantize_fp8(x, granularity, **kw)
        _check(f"torch path {granularity}", values, descale, ref_values, ref_descale, None, None, _rtol(16, True))


@pytest.mark.interpreter
@pytest.mark.parametrize("d", [16, 128])
def test_kernel_rotation_is_the_orthogonal_signed_hadamard(d):
    """Rows e_i * 3 rotate to 3 s_i H[i], entries of one magnitude that quantise to ±448 exactly:
    the kernel's map on the basis is diag(s) H, and its dequantised rows are orthogonal."""
    x = (3.0 * torch.eye(d)).view(1, d, 1, d).to(DEVICE)
    values, descale = quantize_fp8(x, "tensor", hadamard=True, seed=11)
    expected = fp8.random_signs(d, 11)[:, None] * fp8.hadamard(d).sign().float()
    assert torch.equal(values.float().view(d, d).cpu() / fp8.E4M3_MAX, expected)
    # each entry's magnitude, 448 descale, is 3 / sqrt(d) to within three float32 roundings (sqrt(d),
    # the division by it, amax / 448); a squared norm, 9, to within six
    rows = values.double().view(d, d) * descale.double()
    torch.testing.assert_close(rows @ rows.T, 9.0 * torch.eye(d, dtype=torch.float64, device=DEVICE),
                               rtol=0, atol=9.0 * 6 * 2.0 ** -24)


def _error_bound(a64, deq_descale):
    return 2.0 ** -4 * a64.abs() + 2.0 ** -10 * deq_descale + 2 * _rtol(64, True) * fp8.E4M3_MAX * deq_descale


@pytest.mark.interpreter
def test_shared_rotation_keeps_qk_within_fp8_error():
    """Q and K quantised with the same seed, dequantised: Q Kᵀ equals the unrotated product within
    the bound that each feature's half-ulp error gives (Σ |e_q||k'| + |q'||e_k| + |e_q||e_k|); with
    different seeds the product is far off (the check can fail)."""
    q, k = _x((1, 24, 2, 64), torch.float16), _x((1, 24, 2, 64), torch.float16)
    q[..., 5] *= 30.0  # an outlier channel, what the rotation is for
    exact = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double())

    def deq(t, seed):
        values, descale = quantize_fp8(t, "head", hadamard=True, seed=seed)
        s = _broadcast(descale, t.shape, 128)
        return values.double() * s, fp8.rotate(t.double(), fp8.random_signs(64, seed).to(DEVICE)), s

    (qd, qr, sq), (kd, kr, sk) = deq(q, 7), deq(k, 7)
    eq, ek = _error_bound(qr, sq), _error_bound(kr, sk)
    bound = torch.einsum("bqhd,bkhd->bhqk", eq, kr.abs()) + torch.einsum("bqhd,bkhd->bhqk", qr.abs(), ek) + \
        torch.einsum("bqhd,bkhd->bhqk", eq, ek) + 1e-9
    diff = (torch.einsum("bqhd,bkhd->bhqk", qd, kd) - exact).abs()
    assert (diff <= bound).all(), f"Q Kᵀ off by {(diff - bound).max().item():.3e} beyond the FP8 bound"
    other = deq(k, 8)[0]
    assert ((torch.einsum("bqhd,bkhd->bhqk", qd, other) - exact).abs() > bound).any()


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, big", [(torch.float16, 65504.0), (torch.float32, 1e30), (torch.bfloat16, 1e30)])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_saturates_without_nan_and_zero_groups_get_descale_one(granularity, dtype, big):
    """Extreme magnitudes quantise to at most ±448 with each group's largest at ±448, never NaN; an
    all-zero head gets descale 1 and zero values."""
    x = _x((1, 12, 3, 16), torch.float32, scale_heads=False)
    x[:, :, 0] *= big / x[:, :, 0].abs().amax()
    x[:, :, 1] *= 1e-4
    x[:, :, 2] = 0.0
    x = x.to(dtype)
    for hadamard in (False, True):
        values, descale = quantize_fp8(x, granularity, hadamard=hadamard, block_rows=4)
        v = values.float()
        assert not torch.isnan(v).any() and not torch.isnan(descale).any() and v.abs().max() == fp8.E4M3_MAX
        assert (v[:, :, 2] == 0).all()
        if granularity != "tensor":
            assert (descale[:, 2] == 1).all() and (v[:, :, :2].abs().amax(dim=(1, 3)) == fp8.E4M3_MAX).all()


@pytest.mark.interpreter
def test_strided_input_and_empty_input():
    base = _x((2, 3, 20, 32), torch.float16)
    x = base.transpose(1, 2)  # (batch, seqlen, heads, d) with heads outermost in memory
    for granularity in GRANULARITIES:
        got = quantize_fp8(x, granularity, hadamard=True, block_rows=8)
        want = quantize_fp8(x.contiguous(), granularity, hadamard=True, block_rows=8)
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    empty = torch.empty(2, 0, 3, 32, dtype=torch.float16, device=DEVICE)
    for granularity, shape in (("tensor", ()), ("head", (2, 3)), ("block", (2, 3, 0))):
        values, descale = quantize_fp8(empty, granularity)
        assert values.shape == empty.shape and descale.shape == shape and (descale == 1).all()
    assert "quantize_fp8" in ioattn.__all__ and ioattn.quantize_fp8 is quantize_fp8


def _bad_calls():
    x = torch.randn(1, 8, 2, 16, device=DEVICE)
    packed = x[0]
    cu = torch.tensor([0, 3, 8], dtype=I32, device=DEVICE)
    cos, sin, _ = rotary_tables(8, 8, device=DEVICE)
    return [
        (dict(x=packed), ValueError, r"x must be \(batch, seqlen, heads, d\), got shape \(8, 2, 16\)"),
        (dict(x=x, cu_seqlens=cu), ValueError, r"x must be \(total, heads, d\) with cu_seqlens, got shape"),
        (dict(x=x.to(torch.int32)), TypeError, "x must be float16, bfloat16 or float32, got torch.int32"),
        (dict(x=x.tolist()), TypeError, "x must be a torch.Tensor"),
        (dict(x=torch.randn(1, 8, 2, 512, device=DEVICE)), ValueError, r"head dim must be in \[1, 256\]"),
        (dict(x=torch.randn(1, 8, 2, 48, device=DEVICE), hadamard=True), ValueError,
         r"hadamard=True needs a power-of-two head dim .* got head dim 48"),
        (dict(x=x, granularity="row"), ValueError, "granularity must be one of"),
        (dict(x=x, hadamard="yes"), TypeError, "hadamard must be a bool"),
        (dict(x=x, seed=1.5), TypeError, "seed must be an int"),
        (dict(x=x, block_rows=0), ValueError, "block_rows must be a positive int, got 0"),
        (dict(x=torch.randn(1, 8, 2, 256, device=DEVICE), granularity="block", block_rows=256), ValueError,
         "block_rows=256 with head dim 256"),
        (dict(x=packed, cu_seqlens=cu.long()), TypeError, "cu_seqlens must be an int32 tensor"),
        (dict(x=packed, cu_seqlens=cu[None]), ValueError, r"cu_seqlens must have shape \(batch \+ 1,\)"),
        (dict(x=packed, cu_seqlens=torch.tensor([0, 3, 7], dtype=I32, device=DEVICE)), ValueError,
         r"cu_seqlens must rise from 0 to x's 8 rows .* got \[0, 3, 7\]"),
        (dict(x=packed, cu_seqlens=torch.tensor([0, 5, 3, 8], dtype=I32, device=DEVICE)), ValueError,
         "cu_seqlens must rise from 0"),
        (dict(x=x, rotary_cos=cos), ValueError, "rotary_cos and rotary_sin must be given together"),
        (dict(x=x, rotary_cos=cos, rotary_sin=sin[:, :2]), ValueError, "rotary_cos and rotary_sin must both be"),
        (dict(x=x, rotary_cos=cos.int(), rotary_sin=sin), TypeError, "rotary_cos must be a floating-point"),
        (dict(x=x, rotary_cos=torch.ones(8, 9, device=DEVICE), rotary_sin=torch.ones(8, 9, device=DEVICE)),
         ValueError, r"rotary_dim \(2 \* rotary_cos.shape\[1\] = 18\) must be in \(0, head dim 16\]"),
        (dict(x=x, rotary_cos=cos[:6], rotary_sin=sin[:6]), ValueError,
         "rotary_cos/rotary_sin have 6 rows but sequences of up to 8 rows"),
    ]


@pytest.mark.interpreter
@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_input_is_refused_naming_the_argument(case):
    kwargs, error, match = _bad_calls()[case]
    with pytest.raises(error, match=match):
        quantize_fp8(**kwargs)
