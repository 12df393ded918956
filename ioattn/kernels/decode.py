"""Flash-Decoding split-KV attention over a KV cache (contiguous or paged), in Triton.

1-D grid of ``batch * nheads_kv * num_m_blocks * num_splits`` programs (splits fastest). One program
handles one (sequence, KV head, block of query rows, split of the key range):

* **Row packing.** The query rows of *all* the query heads of one KV head's GQA group, for all the
  ``seqlen_q`` query tokens, form one tile: packed row ``r`` is query token ``r // group`` of query
  head ``h_kv * group + r % group`` (heads fastest). Every K/V byte a split reads therefore serves the
  whole group at once. Rows past ``group * seqlen_q`` have a token index ``>= seqlen_q`` and are
  masked like any out-of-range query row. ``num_m_blocks`` is 1 unless ``group * seqlen_q`` exceeds
  the row tile (long appends / prefill through the cache), then row blocks become separate programs.
* **Key range.** Sequence ``b`` attends to absolute cache columns ``[leftpad[b], end[b])``
  (``end = cache_seqlens + seqlen_new``), trimmed by the window's left edge for the first row of the
  tile. The range is cut into ``BLOCK_N``-column chunks aligned to absolute columns (so with
  ``page_size % BLOCK_N == 0`` a chunk never crosses a page) and the chunks are dealt to the splits
  in contiguous runs of ``cdiv(n_chunks, num_splits)``; a split past the last chunk is empty.
* **Masks.** Query token ``i`` sits at column ``end - seqlen_q + i`` (bottom-right aligned w.r.t. the
  valid length, flash-attn's rule: leftpad shifts nothing since both ends count from ``end``);
  ``tile_scores`` applies scale, softcap, causal/window, the key end and ALiBi with ``seqlen_k =
  end``; the leftpad boundary is masked here. Every chunk is masked (decode chunks are few).
* **Output.** Each split writes its normalised partial output (fp32) and its natural-log lse
  (-inf for a split that saw no key) to scratch ``(num_splits, batch, seqlen_q, nheads, d)`` /
  ``(num_splits, batch, seqlen_q, nheads)``; ``merge_attention_states`` combines the splits.

Reference twin: ``ioattn.reference.decode.kvcache_attention_ref``. Test: ``tests/test_decode.py``.
"""
import triton
import triton.language as tl

from ioattn.kernels.common import LOG2E, mma, softmax_finish, softmax_step, tile_scores


@triton.jit
def decode_split_kernel(
    Q, K, V, Opart, Lpart, SeqEnd, Leftpad, BlockTable, CacheBatchIdx, alibi_slopes,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_btb, stride_ab,
    stride_os, stride_ob, stride_om, stride_oh,
    stride_ls, stride_lb, stride_lm,
    nheads_kv, group, seqlen_q, num_m_blocks, num_splits,
    qk_scale, softcap, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
):
    pid = tl.program_id(0)
    split = pid % num_splits
    rest = pid // num_splits
    m_block = rest % num_m_blocks
    rest = rest // num_m_blocks
    h_kv = rest % nheads_kv
    b = rest // nheads_kv

    end = tl.load(SeqEnd + b)
    lp = end * 0  # a tensor either way (it is reassigned under runtime ifs below)
    if HAS_LEFTPAD:
        lp = tl.load(Leftpad + b)

    # packed rows -> (query token, query head)
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // group
    hq = h_kv * group + rows % group
    row_ok = tok < seqlen_q
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    b64 = b.to(tl.int64)
    q_ptrs = (Q + b64 * stride_qb + tok[:, None].to(tl.int64) * stride_qm + hq[:, None].to(tl.int64) * stride_qh
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    slope_log2 = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if HAS_ALIBI:
        slope = tl.load(alibi_slopes + b * stride_ab + hq, mask=row_ok, other=0.0).to(tl.float32)
        slope_log2 = (slope * LOG2E)[:, None]

    # key columns this row block can see: [lo, hi)
    lo = lp
    if window_left >= 0:
        first_tok = (m_block * BLOCK_M) // group
        lo = tl.maximum(lo, first_tok + end - seqlen_q - window_left)
    hi = end
    if window_right >= 0:
        last_tok = tl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // group, seqlen_q - 1)
        hi = tl.minimum(hi, tl.maximum(last_tok + end - seqlen_q + window_right + 1, 0))
    c_lo = lo // BLOCK_N
    c_hi = tl.maximum(tl.cdiv(hi, BLOCK_N), c_lo)
    per_split = tl.cdiv(c_hi - c_lo, num_splits)
    c_start = c_lo + split * per_split
    c_end = tl.minimum(c_start + per_split, c_hi)

    cache_row = b64
    if HAS_BATCH_IDX:
        cache_row = tl.load(CacheBatchIdx + b).to(tl.int64)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)
    k_head = h_kv.to(tl.int64) * stride_kh
    v_head = h_kv.to(tl.int64) * stride_vh
    for c in range(c_start, c_end):
        col0 = c * BLOCK_N
        offs_n = col0 + offs_n0
        if PAGED:
            page = tl.load(BlockTable + b64 * stride_btb + col0 // PAGE_SIZE).to(tl.int64)
            in_page = (col0 % PAGE_SIZE + offs_n0).to(tl.int64)
            k_rows = page * stride_kb + in_page * stride_kn
            v_rows = page * stride_vb + in_page * stride_vn
        else:
            k_rows = cache_row * stride_kb + offs_n.to(tl.int64) * stride_kn
            v_rows = cache_row * stride_vb + offs_n.to(tl.int64) * stride_vn
        kv_ok = (offs_n >= lp) & (offs_n < end)
        # K as (d, n) so q @ k needs no transpose
        k = tl.load(K + k_head + k_rows[None, :] + offs_d[:, None], mask=kv_ok[None, :] & d_ok[:, None], other=0.0)
        qk = mma(q, k)
        s = tile_scores(qk, tok, offs_n, seqlen_q, end, qk_scale, softcap, window_left, window_right,
                        slope_log2, True, HAS_SOFTCAP, HAS_ALIBI)
        s = tl.where(kv_ok[None, :], s, float("-inf"))  # leftpad columns (the key end is in tile_scores)
        p, m_i, l_i, acc = softmax_step(s, m_i, l_i, acc, True)
        v = tl.load(V + v_head + v_rows[:, None] + offs_d[None, :], mask=kv_ok[:, None] & d_ok[None, :], other=0.0)
        acc = mma(p.to(v.dtype), v, acc)

    # rows (or whole splits) that saw no key: output 0, lse -inf
    out, lse = softmax_finish(acc, m_i, l_i, 1.0)
    split64 = split.to(tl.int64)
    tok64 = tok.to(tl.int64)
    hq64 = hq.to(tl.int64)
    o_ptrs = (Opart + split64 * stride_os + b64 * stride_ob + tok64[:, None] * stride_om + hq64[:, None] * stride_oh
              + offs_d[None, :])
    tl.store(o_ptrs, out, mask=row_ok[:, None] & d_ok[None, :])
    tl.store(Lpart + split64 * stride_ls + b64 * stride_lb + tok64 * stride_lm + hq64, lse, mask=row_ok)
