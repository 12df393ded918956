"""FP8 (e4m3) attention in plain PyTorch: the oracle twin of the FP8 kernels and the accuracy study.

* ``hadamard`` / ``fwht``: the normalised Walsh–Hadamard matrix and its O(d log d) transform.
* ``random_signs`` / ``rotate``: FlashAttention-3's incoherent processing, x -> (x * s) H with one
  random ±1 vector s shared by Q and K, an orthogonal map, so Q Kᵀ is unchanged while an outlier
  channel spreads over all d.
* ``quantize_fp8_ref``: e4m3 values and the descales that undo them, per tensor, per (batch, head) or
  per block of rows, saturating at ±448 (never NaN).
* ``attention_fp8_ref``: attention of quantised inputs, computed in float64 from the dequantised
  values, with P quantised to e4m3 before the P V product as the kernels do (``p_scale``: 1 converts
  it as it comes, ``P_SCALE`` lifts it into e4m3's normal range).
"""
from __future__ import annotations

import math

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
GRANULARITIES = ("tensor", "head", "block")
# P (probabilities in [0, 1]) is multiplied by this before its conversion to e4m3, so that the values
# that matter land in e4m3's normal range (2^-6 and up) instead of its subnormals: a power of two,
# undone exactly with the normalisation at the end.
P_SCALE = 256.0
# rows a block descale covers in the FP8 forward (``quantize_fp8``'s default ``block_rows``)
FP8_BLOCK_ROWS = 128


def hadamard(d: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The (d, d) Walsh–Hadamard matrix divided by sqrt(d) (Sylvester's construction): orthogonal and
    symmetric, its own inverse. ``d`` a power of two."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two head dim, got {d}")
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """``x @ hadamard(d)`` over the last dimension in d log d additions (the butterflies a kernel runs)."""
    d = x.shape[-1]
    if d < 1 or d & (d - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two head dim, got {d}")
    y, h = x.reshape(-1, d), 1
    while h < d:  # pairs (i, i + h) within blocks of 2h: (a + b, a - b)
        y = y.view(-1, d // (2 * h), 2, h)
        y = torch.stack([y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]], dim=2).view(-1, d)
        h *= 2
    return (y / math.sqrt(d)).view(x.shape)


def random_signs(d: int, seed: int, device=None) -> torch.Tensor:
    """d random ±1 values (float32) from ``seed``: the diagonal shared by Q and K."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (d,), generator=g) * 2 - 1).to(device=device, dtype=torch.float32)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """(x * signs) H over the last dimension, in x's dtype (computed in float32 or wider)."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    return fwht(x.to(wide) * signs.to(wide)).to(x.dtype)


def quantize_fp8_ref(x: torch.Tensor, granularity: str = "tensor", block_rows: int = 128):
    """(e4m3 values, descale) of ``x`` (batch, seqlen, heads, d): x ≈ values * descale, the descale
    amax / 448 over the whole tensor (shape ()), each (batch, head) (shape (batch, heads)) or each
    block of ``block_rows`` rows of one (batch, head) (shape (batch, heads, blocks)). Values past the
    range saturate; an all-zero group gets descale 1."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, seqlen, heads, d), got shape {tuple(x.shape)}")
    xf = x.to(torch.float32)
    batch, seqlen, heads, _ = x.shape
    if granularity == "tensor":
        amax = xf.abs().amax()
        scale = amax.expand(1, 1, 1, 1)
    elif granularity == "head":
        amax = xf.abs().amax(dim=(1, 3))  # (batch, heads)
        scale = amax[:, None, :, None]
    else:
        blocks = -(-seqlen // block_rows)
        padded = torch.nn.functional.pad(xf, (0, 0, 0, 0, 0, blocks * block_rows - seqlen))
        amax = padded.abs().view(batch, blocks, block_rows, heads, -1).amax(dim=(2, 4)).transpose(1, 2)
        scale = amax.transpose(1, 2).repeat_interleave(block_rows, dim=1)[:, :seqlen, :, None]
    # amax / 448 rounded once, on every device (CUDA's division by a Python scalar multiplies by its
    # reciprocal, one ulp away at times): in float64, then to float32
    descale = torch.where(amax > 0, (amax.double() / E4M3_MAX).float(), torch.ones_like(amax))
    scale = torch.where(scale > 0, (scale.double() / E4M3_MAX).float(), torch.ones_like(scale))
    values = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return values, descale


def dequantize_fp8_ref(values: torch.Tensor, descale: torch.Tensor, block_rows: int = 128) -> torch.Tensor:
    """float64 ``values * descale`` for ``quantize_fp8_ref``'s descale shapes."""
    v = values.to(torch.float64)
    s = descale.to(torch.float64)
    if s.dim() == 0:
        return v * s
    if s.dim() == 2:  # (batch, heads)
        return v * s[:, None, :, None]
    s = s.transpose(1, 2).repeat_interleave(block_rows, dim=1)[:, :v.shape[1], :, None]
    return v * s


def quantize_p(p: torch.Tensor, scale: float = P_SCALE) -> torch.Tensor:
    """P (probabilities in [0, 1], float64) through e4m3 and back, multiplied by ``scale`` first: 1
    converts it as it comes (the small probabilities fall into e4m3's subnormals or to 0, FA3's
    baseline), ``P_SCALE`` (the kernels' choice) lifts them into the normal range."""
    return (p * scale).clamp(max=E4M3_MAX).to(E4M3).to(torch.float64) / scale


def attention_fp8_ref(q, k, v, q_descale, k_descale, v_descale, softmax_scale=None, causal=False,
                      p_scale: float = P_SCALE, block_rows: int = 128) -> torch.Tensor:
    """float64 attention of e4m3 q, k, v (batch, seqlen, heads, d; GQA allowed) with their descales
    (``quantize_fp8_ref``'s shapes), P through e4m3 before P V (``quantize_p``), the causal mask
    bottom-right aligned. Returns (batch, seqlen_q, heads, d) float64."""
    qd, kd, vd = (dequantize_fp8_ref(t, s, block_rows) for t, s in ((q, q_descale), (k, k_descale), (v, v_descale)))
    group = qd.shape[2] // kd.shape[2]
    kd, vd = (t.repeat_interleave(group, dim=2) for t in (kd, vd))
    scale = qd.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(~keep.to(s.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    p = quantize_p(e, p_scale)  # the unnormalised probabilities, as the kernels hold them
    out = torch.einsum("bhqk,bkhd->bqhd", p, vd) / denom.transpose(1, 2).clamp(min=torch.finfo(torch.float64).tiny)
    return out
