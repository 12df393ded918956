"""The Gluon forward's exp2 on the FMA units (``ioattn.kernels.hopper_softmax._exp2_poly``, switched on
by ``ioattn.plan.hopper.exp2_fma``): its constants, how they were fitted, and a float32 twin of the
kernel's formula, so that the arithmetic is tested on any machine (the kernel itself needs an
sm_90 GPU).

2**x = 2**n 2**f with n = round(x) and f = x - n in [-1/2, 1/2]:

* n: x + 1.5 * 2**23 in float32 has a unit in the last place of 1, so the addition rounds x to the
  nearest integer and the sum's low mantissa bits hold n (two's complement, modulo 2**23); the
  sum minus the same constant is n as a float (both additions exact but the first's rounding);
* 2**f: the cubic 1 + f (C1 + f (C2 + f C3)), three FMAs; the constant term is 1, so 2**0 (and
  2**n for every integer n) comes out exactly;
* 2**n: the sum's bits shifted left by 23 (the constant's own bits move past bit 31 and vanish)
  added to the cubic's bits, which adds n to its exponent field.

x is clamped at -127 first: there n = -127, f = 0, the cubic is 1.0 (bits 0x3F800000) and n's shift
is -0x3F800000, so the result's bits are 0, i.e. 0.0, for -inf (masked scores) and anything below
-127 (MUFU.EX2 with flush-to-zero gives 0 there too). Between -127 and -126 the result is a
subnormal below 2**-126, where MUFU.EX2 flushes to 0. For x in [-126, 1/2] it is within the
cubic's relative error of 2**x (``MAX_REL_ERROR``).
"""
from __future__ import annotations

import torch

ROUND = 12582912.0  # 1.5 * 2**23
# The cubic's coefficients, float32 (the kernel's EXP2_C1..C3): ``fit_exp2_cubic()`` rounded to float32
C1 = 0.6932829022407532
C2 = 0.2422109991312027
C3 = 0.05500893294811249
# Max relative error of the kernel's formula on [-126, 0] (``exp2_poly`` against exact 2**x; the
# cubic's own minimax error is 1.013e-4, float32 rounding adds < 1e-6). Compare the rounding of P to
# bf16 (2**-8 = 3.9e-3) or fp16 (2**-11 = 4.9e-4) before P V.
MAX_REL_ERROR = 1.02e-4


def fit_exp2_cubic(points: int = 4001, iterations: int = 1000) -> tuple[tuple[float, float, float], float]:
    """((C1, C2, C3), max relative error) of the cubic 1 + C1 f + C2 f**2 + C3 f**3 closest to 2**f on
    [-1/2, 1/2] in relative error, constant term fixed at 1: Lawson's algorithm (least squares of
    the relative error, reweighted each pass by the error at each point, which converges to the
    minimax fit) on ``points`` equally spaced points, in float64."""
    f = torch.linspace(-0.5, 0.5, points, dtype=torch.float64)
    t = torch.exp2(f)
    a = torch.stack([f, f * f, f * f * f], 1) / t[:, None]  # (p(f) - 1) / 2**f per coefficient
    b = 1 - 1 / t  # relative error p(f) / 2**f - 1 = a @ c - b
    w = torch.full_like(f, 1.0 / points)
    for _ in range(iterations):
        sw = w.sqrt()
        c = torch.linalg.lstsq(a * sw[:, None], (b * sw)[:, None]).solution[:, 0]
        err = (a @ c - b).abs()
        w = w * err / torch.dot(w, err)
    return tuple(c.tolist()), float(err.max())


def _fma32(a: torch.Tensor, b: torch.Tensor | float, c: float) -> torch.Tensor:
    """float32 a * b + c, rounded as an FMA (the product of two float32 values is exact in float64;
    the sum is rounded twice, to float64 then float32, which can differ from one rounding by an ulp
    in rare ties)."""
    return (a.double() * b + c).float()


def exp2_poly(x: torch.Tensor) -> torch.Tensor:
    """The kernel's formula on a float32 tensor, step for step (float32 additions, the cubic's FMAs,
    the integer add of the shifted exponent bits, modulo 2**32)."""
    x = torch.fmax(x.float(), torch.tensor(-127.0))  # as the kernel's max.f32 (FMNMX): NaN gives -127
    r = x + ROUND
    f = x - (r - ROUND)
    q = _fma32(f, _fma32(f, _fma32(f, C3, C2), C1), 1.0)  # C1..C3 are float32 values
    bits = (q.view(torch.int32).to(torch.int64) + (r.view(torch.int32).to(torch.int64) << 23)) & 0xFFFFFFFF
    bits = torch.where(bits >= 2**31, bits - 2**32, bits)  # back to int32's two's complement
    return bits.to(torch.int32).view(torch.float32)
