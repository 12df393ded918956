"""Merge of split-KV partial results (Flash-Decoding's combine): one program per block of rows,
each row's splits reduced in registers. Reference twin: ``ioattn.reference.merge.merge_states_ref``."""
import triton
import triton.language as tl


@triton.jit
def merge_states_kernel(Outs, Lses, Out, Lse, n_rows, n_splits, stride_os, stride_or, stride_ls, nheads, seqlen_q,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                        BLOCK_R: tl.constexpr, LSE_BHM: tl.constexpr):
    """Rows are the flattened leading dims of the outputs. ``LSE_BHM``: the rows are (batch,
    seqlen_q, nheads) and the merged lse goes out in flash-attn's (batch, nheads, seqlen_q) layout
    (the decode path), saving a transpose kernel."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    splits = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    lse = tl.load(Lses + splits[:, None].to(tl.int64) * stride_ls + rows64[None, :],
                  mask=(splits[:, None] < n_splits) & row_ok[None, :], other=float("-inf"))  # (S, R)
    lse_max = tl.max(lse, 0)
    # rows where every split is empty: keep -inf, weigh everything 0 (never -inf - -inf = NaN)
    lse_max_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp(lse - lse_max_safe[None, :])
    total = tl.sum(w, 0)
    merged_lse = tl.where(total == 0.0, float("-inf"), lse_max_safe + tl.log(tl.where(total == 0.0, 1.0, total)))
    w = w / tl.where(total == 0.0, 1.0, total)[None, :]
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for s in range(0, n_splits):
        ws = tl.sum(tl.where(splits[:, None] == s, w, 0.0), 0)  # (R,) weight of split s
        o = tl.load(Outs + s * stride_os + rows64[:, None] * stride_or + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        acc += ws[:, None] * o.to(tl.float32)
    tl.store(Out + rows64[:, None] * HEAD_DIM + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if LSE_BHM:
        h = rows64 % nheads
        bm = rows64 // nheads
        lse_idx = (bm // seqlen_q) * nheads * seqlen_q + h * seqlen_q + bm % seqlen_q
    else:
        lse_idx = rows64
    tl.store(Lse + lse_idx, merged_lse, mask=row_ok)
