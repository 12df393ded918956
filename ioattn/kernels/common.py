"""Triton pieces shared by the forward and backward kernels: the block ranges a tile visits and the
score pipeline of one tile. Same rules as ``ioattn.masks`` (the host/reference twin); the tests
hold the two against each other."""
import triton
import triton.language as tl

from ioattn.kernels import constants
from ioattn.reference import fp8

LOG2E = tl.constexpr(constants.LOG2E)
LN2 = tl.constexpr(constants.LN2)
P_SCALE = tl.constexpr(fp8.P_SCALE)
FP8_BLOCK_ROWS = tl.constexpr(fp8.FP8_BLOCK_ROWS)  # rows a block descale covers



@triton.jit
def tile_coords(num_blocks, REVERSE: tl.constexpr):
    """(block index, batch * head index) of this program in the 1-D grid, blocks fastest.
    ``REVERSE`` hands out the last blocks first: under a causal mask they have the most work, so
    starting them early balances the tail."""
    pid = tl.program_id(0)
    block = pid % num_blocks
    if REVERSE:
        block = num_blocks - 1 - block
    return block, pid // num_blocks


@triton.jit
def seq_info(b, cu_seqlens_q, cu_seqlens_k, seqlen_q_max, seqlen_k_max, IS_VARLEN: tl.constexpr):
    """Row offset and length of sequence ``b`` in Q and in K/V: from ``cu_seqlens`` for packed
    (varlen) inputs, else the batch's common lengths (rows then start at 0 of each batch entry)."""
    if IS_VARLEN:
        q_start = tl.load(cu_seqlens_q + b)
        seqlen_q = tl.load(cu_seqlens_q + b + 1) - q_start
        k_start = tl.load(cu_seqlens_k + b)
        seqlen_k = tl.load(cu_seqlens_k + b + 1) - k_start
    else:
        q_start = 0
        seqlen_q = seqlen_q_max
        k_start = 0
        seqlen_k = seqlen_k_max
    return q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def tile_start(block, bh, nheads, group, cu_seqlens_q, cu_seqlens_k, seqlen_q_max, seqlen_k_max,
               BLOCK: tl.constexpr, IS_VARLEN: tl.constexpr):
    """A tile's prologue: batch b and head h of ``bh`` (``nheads`` heads per batch entry), the KV
    head h // ``group`` (1 where the heads are KV heads), sequence b's ``seq_info`` and the first row
    of block ``block`` of ``BLOCK`` rows."""
    b = bh // nheads
    h = bh % nheads
    h_kv = h // group
    q_start, seqlen_q, k_start, seqlen_k = seq_info(b, cu_seqlens_q, cu_seqlens_k, seqlen_q_max,
                                                    seqlen_k_max, IS_VARLEN)
    return b, h, h_kv, q_start, seqlen_q, k_start, seqlen_k, block * BLOCK


@triton.jit
def _block_span(lo, full_lo, full_hi, hi, BLOCK: tl.constexpr):
    """Rows [lo, hi) as block indices [first, end), with [full_lo, full_hi) (the rows no mask cuts)
    shrunk to whole blocks inside them: (first, first unmasked, end of unmasked, end)."""
    first = lo // BLOCK
    end = tl.maximum(tl.cdiv(hi, BLOCK), first)
    full_first = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK), first), end)
    full_end = tl.maximum(tl.minimum(full_hi // BLOCK, end), full_first)
    return first, full_first, full_end, end


@triton.jit
def kv_block_range(m_start, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, seqlen_q, seqlen_k,
                   window_left, window_right):
    """Key blocks seen by query rows [m_start, m_start + BLOCK_M):
    [n_min, n_max) is every block with a visible key; [n_full_lo, n_full_hi) the blocks that no
    mask cuts (no window edge, no seqlen_k boundary), which the caller runs without masking."""
    offset = seqlen_k - seqlen_q
    m_last = tl.minimum(m_start + BLOCK_M, seqlen_q) - 1
    hi = seqlen_k
    full_hi = seqlen_k
    if window_right >= 0:
        hi = tl.maximum(tl.minimum(seqlen_k, m_last + offset + window_right + 1), 0)
        full_hi = tl.maximum(tl.minimum(seqlen_k, m_start + offset + window_right + 1), 0)
    lo = 0
    full_lo = 0
    if window_left >= 0:
        lo = tl.maximum(m_start + offset - window_left, 0)
        full_lo = tl.maximum(m_start + BLOCK_M - 1 + offset - window_left, 0)
    return _block_span(lo, full_lo, full_hi, hi, BLOCK_N)


@triton.jit
def q_block_range(n_start, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, seqlen_q, seqlen_k,
                  window_left, window_right):
    """Query blocks that see key columns [n_start, n_start + BLOCK_N): the transpose of
    ``kv_block_range``, for the dK/dV pass. Same return convention."""
    offset = seqlen_k - seqlen_q
    n_last = tl.minimum(n_start + BLOCK_N, seqlen_k) - 1
    # key j is visible to query i iff j - offset - right <= i <= j - offset + left
    lo = 0
    full_lo = 0
    if window_right >= 0:
        lo = tl.maximum(n_start - offset - window_right, 0)
        full_lo = tl.maximum(n_start + BLOCK_N - 1 - offset - window_right, 0)
    hi = seqlen_q
    full_hi = seqlen_q
    if window_left >= 0:
        hi = tl.maximum(tl.minimum(seqlen_q, n_last - offset + window_left + 1), 0)
        full_hi = tl.maximum(tl.minimum(seqlen_q, n_start - offset + window_left + 1), 0)
    # a key block that runs past seqlen_k must be masked for every query block
    full_lo = tl.where(n_start + BLOCK_N > seqlen_k, seqlen_q + BLOCK_M, full_lo)
    return _block_span(lo, full_lo, full_hi, hi, BLOCK_M)


@triton.jit
def listed_block(i, block_list=None, SUB: tl.constexpr = 1):
    """The block of a loop's step i: i itself, or with a block mask's ``block_list`` sub-block i % ``SUB``
    of the block it lists at i // ``SUB``."""
    if block_list is None:
        return i
    else:
        return tl.load(block_list + i // SUB) * SUB + i % SUB


@triton.jit
def block_row(blocks, b, h, start, BLOCK: tl.constexpr):
    """The row of a block mask's lists (``blocks``: ``ioattn.modcall``'s, batch and head strides at 4 and
    5) for batch entry ``b``, head ``h`` and the block holding position ``start`` (blocks of ``BLOCK``)."""
    return b * blocks[4] + h * blocks[5] + start // BLOCK


@triton.jit
def block_list_run(blocks, row, RUN: tl.constexpr, SUB: tl.constexpr, IS_VARLEN: tl.constexpr):
    """A block mask's walk of ``row`` in three runs (``blocks``: ``ioattn.modcall``'s (partial counts,
    partial lists, full counts, full lists, batch stride, head stride, entries a row)): (list, first step,
    end step). Run 0: the partial blocks (the mask function applies); 1: the full blocks but the last, which
    lie inside the sequence (no bounds mask; fixed lengths, where the mask was built for the call's own);
    2: the last full block, which may hold the sequence's end (varlen: every full block, masked)."""
    offset = row.to(tl.int64) * blocks[6]
    if RUN == 0:
        return blocks[1] + offset, 0, tl.load(blocks[0] + row) * SUB
    else:
        n = tl.load(blocks[2] + row) * SUB
        if IS_VARLEN:
            last = 0
        else:
            last = tl.maximum(n - SUB, 0)
        if RUN == 1:
            return blocks[3] + offset, 0, last
        else:
            return blocks[3] + offset, last, n


@triton.jit
def tanh(x):
    # exp-based so it also runs under the interpreter; saturates to +-1 without NaN
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def tile_scores(qk, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale_log2, softcap, window_left,
                window_right, slope_log2, MASKED: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr):
    """Raw q.k tile -> scores in the log2 domain: scale, softcap, mask, ALiBi (ioattn.masks order).
    ``qk_scale_log2`` is softmax_scale * log2(e); with softcap it is softmax_scale / cap and the
    cap (times log2 e) is applied after tanh."""
    if HAS_SOFTCAP:
        s = (softcap * LOG2E) * tanh(qk * qk_scale_log2)
    else:
        s = qk * qk_scale_log2
    rel = offs_m[:, None] + (seqlen_k - seqlen_q) - offs_n[None, :]  # query position - key
    if MASKED:
        keep = (offs_n[None, :] < seqlen_k) & (offs_m[:, None] < seqlen_q)
        if window_right >= 0:
            keep = keep & (rel >= -window_right)
        if window_left >= 0:
            keep = keep & (rel <= window_left)
        s = tl.where(keep, s, float("-inf"))
    if HAS_ALIBI:
        s = s - slope_log2 * tl.abs(rel).to(tl.float32)
    return s


@triton.jit
def dropout_keep(seed, threshold, row_base, offs_n, seqlen_k_max):
    """Counter-based dropout mask: element (b, h, i, j) uses counter
    ((b * nheads + h) * max_seqlen_q + i) * max_seqlen_k + j (``row_base`` is the int64 row part),
    kept iff its philox draw >= threshold (= p * 2**32). Twin: ioattn.reference.philox."""
    counters = row_base[:, None] * seqlen_k_max + offs_n[None, :].to(tl.int64)
    r = tl.randint(seed, counters)
    return r.to(tl.int64) >= threshold


@triton.jit
def mma(a, b, acc=None):
    """tl.dot, exact for float32 inputs (IEEE instead of TF32, so fp32 calls keep fp32 accuracy)."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def softmax_step(s, m_i, l_i, acc, GUARD_EMPTY: tl.constexpr):
    """One online-softmax step on a tile of log2-domain scores: new running max and sum, the
    accumulator rescaled, and the tile's unnormalised probabilities (FlashAttention-2: no division
    until the end). ``GUARD_EMPTY``: rows may have seen no key yet (masked tiles) -- their max stays
    -inf and 0 is subtracted instead, so exp2 gives 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if GUARD_EMPTY:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    return p, m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None]


@triton.jit
def softmax_step_lazy(s, m_i, l_i, acc, TAU: tl.constexpr, GUARD_EMPTY: tl.constexpr):
    """``softmax_step`` with FlashAttention-4's conditional rescaling: the accumulator rescale
    (BLOCK_M x D multiplies per key tile) runs only when some row's max grows by more than ``TAU``
    (log2 units), decided once per tile by a scalar branch. Otherwise the stale max stays the
    reference: p = exp2(s - m_i) <= 2**TAU (fp16 holds it for TAU <= 15), l_i grows by rowsum(p)
    and acc is untouched. Exact: acc, l and the lse always share one reference max. Rows still at
    -inf are measured from the lowest finite float: growth -inf (never NaN) while they see no key,
    huge at their first key, which forces the rescale."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    grow = m_new - tl.maximum(m_i, -3.4028234663852886e38)
    if tl.max(grow, 0) > TAU:
        p, m_i, l_i, acc = softmax_step(s, m_i, l_i, acc, GUARD_EMPTY)
    else:
        if GUARD_EMPTY:
            m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
        else:
            m_use = m_i
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i + tl.sum(p, 1)
    return p, m_i, l_i, acc


@triton.jit
def softmax_finish(acc, m_i, l_i, out_scale):
    """Normalise once at the end; rows that saw no key (l = 0) give output 0 and lse -inf."""
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc * (out_scale / l_safe)[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    return out, lse
