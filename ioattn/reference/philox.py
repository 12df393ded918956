"""A pure-PyTorch twin of Triton's counter-based RNG (``tl.randint`` on int64 offsets).

The Triton kernels draw their dropout mask with ``tl.randint(seed, offset)``; this module rebuilds
the very same bits on any device so that tests can hand the reference implementations the exact
mask a kernel used. Philox-4x32 with 10 rounds: counter ``(offset_lo, offset_hi, 0, 0)``, key
``(seed_lo, seed_hi)``; ``randint`` keeps the first output word.
"""
from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_N_ROUNDS = 10


def _mul32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``a * b`` for uint32 values held in int64.

    The full product can reach 2**64 and would overflow int64 (signed overflow is undefined
    behaviour in the C++ kernels underneath), so ``b`` is split into 16-bit halves: every partial
    product stays below 2**48.
    """
    b_lo = b & _MASK16
    b_hi = b >> 16
    p_lo = a * b_lo  # < 2**48
    mid = a * b_hi + (p_lo >> 16)  # = (a * b) >> 16, < 2**49
    hi = mid >> 16
    lo = ((mid & _MASK16) << 16) | (p_lo & _MASK16)
    return hi, lo


def philox_randint(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """Bit-identical to ``tl.randint(seed, offsets)`` for an int64 ``offsets`` block.

    Returns int64 values in ``[0, 2**32)`` (Triton's uint32 result, zero-extended).
    """
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF  # Triton casts the seed to uint64 first
    offsets = offsets.to(torch.int64)
    c0 = offsets & _MASK32
    # Triton shifts the *signed* offset, so the high word of a negative offset is sign-filled;
    # the arithmetic shift of torch int64 followed by the mask reproduces that.
    c1 = (offsets >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK32, seed >> 32
    for _ in range(_N_ROUNDS):
        hi_b, lo_b = _mul32(_ROUND_B, c2)
        hi_a, lo_a = _mul32(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0


def dropout_threshold(p: float) -> int:
    """uint32 threshold: an element is kept iff its ``randint >= dropout_threshold(p)``."""
    if p <= 0.0:
        return 0
    return min(int(p * 2**32), 2**32 - 1)


def dropout_keep_mask(seed: int, p: float, batch: int, nheads: int, seqlen_q: int, seqlen_k: int,
                      device=None) -> torch.Tensor:
    """Bool ``(batch, nheads, seqlen_q, seqlen_k)`` keep mask the kernels draw for ``(seed, p)``.

    Element ``(b, h, i, j)`` uses counter ``((b * nheads + h) * seqlen_q + i) * seqlen_k + j``.
    Materialises the whole mask: meant for tests on small shapes.
    """
    offsets = torch.arange(batch * nheads * seqlen_q * seqlen_k, dtype=torch.int64, device=device)
    keep = philox_randint(seed, offsets) >= dropout_threshold(p)
    return keep.view(batch, nheads, seqlen_q, seqlen_k)


class LazyDropoutMask:
    """The keep mask of ``dropout_keep_mask`` drawn one tile at a time, so that the CPU path's memory
    stays linear in the sequence length. ``batch_index`` picks one sequence of a varlen batch (the
    counters still use the padded ``(batch, nheads, seqlen_q, seqlen_k)`` numbering, as the kernels do).

    Call with a tile's row and column ranges: ``mask(m0, m1, n0, n1)`` -> bool
    ``(batch or 1, nheads, m1 - m0, n1 - n0)``.
    """

    def __init__(self, seed, p, batch, nheads, seqlen_q, seqlen_k, batch_index=None, device=None):
        self.seed, self.threshold = seed, dropout_threshold(p)
        self.nheads, self.seqlen_q, self.seqlen_k = nheads, seqlen_q, seqlen_k
        self.batches = torch.arange(batch) if batch_index is None else torch.tensor([batch_index])
        self.device = device

    def __call__(self, m0, m1, n0, n1):
        bh = (self.batches[:, None] * self.nheads + torch.arange(self.nheads)).to(torch.int64)
        rows = bh[..., None] * self.seqlen_q + torch.arange(m0, m1)
        counters = rows[..., None] * self.seqlen_k + torch.arange(n0, n1)
        return (philox_randint(self.seed, counters.to(self.device)) >= self.threshold)
