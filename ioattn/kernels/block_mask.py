"""A block mask's classes: one program per (query block, key block, batch * head) evaluates the mask
function (``ioattn.kernels.modgen``) over the block and writes 0 (no pair kept), 2 (every pair
inside the lengths kept) or 1 (some).

Reference twin: ``ioattn.block_mask._classify_dense``. Test: ``tests/test_block_mask.py``.
"""
import triton
import triton.language as tl


@triton.jit
def classify_blocks_kernel(Out, caps, nheads, seqlen_q, seqlen_k, n_kblocks, MASK_MOD: tl.constexpr,
                           BQ: tl.constexpr, BK: tl.constexpr, SUB_Q: tl.constexpr):
    """``Out`` int8 (batch * nheads, q blocks, k blocks), contiguous; the block's rows ``SUB_Q`` at a
    time (a [SUB_Q, BK] tile of mask values in registers)."""
    qb = tl.program_id(0) // n_kblocks
    kb = tl.program_id(0) % n_kblocks
    bh = tl.program_id(1)
    b = bh // nheads
    h = bh % nheads
    kv = kb * BK + tl.arange(0, BK)[None, :]
    kept = 0
    valid = 0
    for i in tl.static_range(BQ // SUB_Q):
        q = qb * BQ + i * SUB_Q + tl.arange(0, SUB_Q)[:, None]
        inside = (q < seqlen_q) & (kv < seqlen_k)
        keep = MASK_MOD(b, h, q, kv, caps) & inside
        kept += tl.sum(tl.sum(keep.to(tl.int32), 1), 0)
        valid += tl.sum(tl.sum(inside.to(tl.int32), 1), 0)
    cls = tl.where(kept == 0, 0, tl.where(kept == valid, 2, 1))
    n_qblocks = tl.cdiv(seqlen_q, BQ)
    tl.store(Out + (bh.to(tl.int64) * n_qblocks + qb) * n_kblocks + kb, cls.to(tl.int8))
