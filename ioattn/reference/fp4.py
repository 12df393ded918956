"""FP4 (e2m1) in plain PyTorch: the formats of the Direct-P study (probabilities P quantised before P V).

Hopper has no FP4 arithmetic; this is emulation, everything outside the quantised operand in float64.

* ``quantize_e2m1``: the 8 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (1 sign, 2 exponent, 1 mantissa
  bit), round to nearest, ties to the even code, saturating at ±6.
* ``quantize_mxfp4``: OCP MX block scaling: 32 consecutive elements of the last dimension share a
  power-of-two (E8M0) scale, 2^(floor(log2(amax)) - 2), so the block's largest exponent lands on
  e2m1's largest (6 = 1.5 * 2^2).
* ``quantize_nvfp4``: NVFP4: 16 elements share an e4m3 scale, under a float32 per-tensor scale
  448 * 6 / amax that puts the block scales in e4m3's range.
* ``quantize_p_as``: P through one of ``P_FORMATS``; ``attention_quantised_p``: attention with it.
"""
from __future__ import annotations

import torch

from ioattn.reference.fp8 import E4M3, E4M3_MAX, P_SCALE, quantize_p

F64 = torch.float64
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # indexed by the 3-bit code without its sign
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of e2m1's largest value, 6 = 1.5 * 2^2
MX_BLOCK = 32
NVFP4_BLOCK = 16
E8M0_EXP = (-127, 127)  # the exponents an E8M0 scale holds (255 is NaN)
P_FORMATS = ("bf16", "fp8", "mxfp4", "nvfp4")


def quantize_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to e2m1 values, as float64: the nearest of ±E2M1_VALUES, a tie to the even code
    (0, 1, 2, 4: mantissa bit 0), magnitudes past 6 saturating to 6."""
    a = x.to(F64).abs().clamp(max=E2M1_MAX)
    # the grid's spacing is 0.5 below 2, 1 in [2, 4) and 2 from 4: in units of the spacing the codes
    # are consecutive integers, even codes on even ones, so round-half-to-even picks the even code
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, x.to(F64))


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` in float64 as (..., blocks, size) over its last dimension, zero-padded to whole blocks."""
    n = x.shape[-1]
    pad = -n % size
    xf = torch.nn.functional.pad(x.to(F64), (0, pad))
    return xf.view(*x.shape[:-1], (n + pad) // size, size)


def _unblock(xb: torch.Tensor, n: int) -> torch.Tensor:
    return xb.flatten(-2)[..., :n]


def quantize_mxfp4(x: torch.Tensor, block: int = MX_BLOCK):
    """(e2m1 values (..., blocks, block), E8M0 scales (..., blocks)) of ``x`` over its last dimension:
    x ≈ values * scale, the scale 2^(floor(log2(amax)) - 2) of each block's amax, its exponent clamped
    to E8M0's range; an all-zero block gets scale 1. Elements whose magnitude rounds past 6 after the
    scaling saturate (the MX spec's rule: the scale follows amax's exponent, not its mantissa)."""
    xb = _blocks(x, block)
    amax = xb.abs().amax(dim=-1)
    _, e = torch.frexp(amax)  # amax = m * 2^e, m in [0.5, 1): floor(log2(amax)) = e - 1
    exp = torch.where(amax > 0, e - 1 - E2M1_EMAX, torch.zeros_like(e)).clamp(*E8M0_EXP)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    return quantize_e2m1(xb / scale[..., None]), scale


def quantize_nvfp4(x: torch.Tensor, block: int = NVFP4_BLOCK, tensor_amax: float | None = None):
    """(e2m1 values (..., blocks, block), e4m3 block scales (..., blocks) as float64, float32 global
    scale) of ``x`` over its last dimension: x ≈ values * block_scale / global_scale. The global scale
    is 448 * 6 / amax (``tensor_amax``: a known bound instead of the data's, e.g. 1 for P), so that
    each block scale, its amax / 6 * global_scale rounded to e4m3, fits e4m3's range. A block whose
    scale rounds to 0 becomes 0."""
    xb = _blocks(x, block)
    amax = float(x.abs().max()) if tensor_amax is None else float(tensor_amax)
    global_scale = torch.tensor(E4M3_MAX * E2M1_MAX / amax if amax > 0 else 1.0, dtype=torch.float32)
    gs = global_scale.to(F64)
    wanted = xb.abs().amax(dim=-1) / E2M1_MAX * gs
    block_scale = wanted.clamp(max=E4M3_MAX).to(E4M3).to(F64)
    bs = block_scale[..., None]
    values = quantize_e2m1(torch.where(bs > 0, xb * gs / torch.where(bs > 0, bs, 1.0), 0.0))
    return values, block_scale, global_scale


def mxfp4_round_trip(x: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """``x`` through MXFP4 and back, float64, x's shape."""
    values, scale = quantize_mxfp4(x, block)
    return _unblock(values * scale[..., None], x.shape[-1])


def nvfp4_round_trip(x: torch.Tensor, block: int = NVFP4_BLOCK, tensor_amax: float | None = None) -> torch.Tensor:
    """``x`` through NVFP4 and back, float64, x's shape."""
    values, block_scale, global_scale = quantize_nvfp4(x, block, tensor_amax)
    return _unblock(values * block_scale[..., None] / global_scale.to(F64), x.shape[-1])


def quantize_p_as(p: torch.Tensor, fmt: str) -> torch.Tensor:
    """P (float64, rows in [0, 1], keys last) through ``fmt`` and back: "bf16" (rounded to bfloat16),
    "fp8" (e4m3 after scaling by ``P_SCALE``), "mxfp4" or "nvfp4" (blocks of keys; NVFP4's tensor
    scale from P's known bound 1, as a kernel would fix it)."""
    if fmt == "bf16":
        return p.to(torch.bfloat16).to(F64)
    if fmt == "fp8":
        return quantize_p(p, P_SCALE)
    if fmt == "mxfp4":
        return mxfp4_round_trip(p)
    if fmt == "nvfp4":
        return nvfp4_round_trip(p, tensor_amax=1.0)
    raise ValueError(f"P format must be one of {P_FORMATS}, got {fmt!r}")


def attention_quantised_p(scores: torch.Tensor, v: torch.Tensor, fmt: str) -> torch.Tensor:
    """float64 softmax(scores) v with the unnormalised P = exp(s - m) through ``fmt`` before P V and
    the row sums taken from the unquantised P (kernels add them up before the conversion). scores
    (batch, heads, seqlen_q, seqlen_k), masked entries -inf; v (batch, seqlen_k, heads, d).
    Returns (batch, seqlen_q, heads, d); a row with no visible key gives 0."""
    s = scores.to(F64)
    m = s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(F64).tiny)
    out = torch.einsum("bhqk,bkhd->bqhd", quantize_p_as(p, fmt), v.to(F64))
    return out / denom.transpose(1, 2)
