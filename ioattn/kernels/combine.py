"""Merge of split-KV partial results (Flash-Decoding's combine): one program per row, all of the
row's splits loaded at once (a loop over splits would pay one memory latency per split; a decode
step has few rows and tens of splits). Reference twin: ``ioattn.reference.merge.merge_states_ref``.

``USE_PDL`` (Hopper, launched with programmatic dependent launch after the split kernel): the merge
grid is resident before the split kernel ends and waits in ``gdc_wait`` until its writes are
visible, so the launch gap between the two kernels of a decode step is hidden. With at most
``CHUNK_S`` splits every output is loaded with the lses, one memory round trip instead of two in
series (docs/decisions/decode-launches.md)."""
import triton
import triton.language as tl
try:
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # a Triton without grid dependency control: the host never sets USE_PDL there
    @triton.jit
    def gdc_wait():
        pass


@triton.jit
def merge_states_kernel(Outs, Lses, Out, Lse, n_rows, n_splits, stride_os, stride_or, stride_ls, nheads, seqlen_q,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                        CHUNK_S: tl.constexpr, LSE_BHM: tl.constexpr, USE_PDL: tl.constexpr = False):
    """Rows are the flattened leading dims of the outputs; ``BLOCK_S`` >= n_splits, the outputs are
    read ``CHUNK_S`` splits at a time (all at once, with the lses, when ``BLOCK_S <= CHUNK_S``).
    ``LSE_BHM``: the rows are (batch, seqlen_q, nheads) and the merged lse goes out in flash-attn's
    (batch, nheads, seqlen_q) layout (the decode path)."""
    row = tl.program_id(0).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    if USE_PDL:
        gdc_wait()  # the split kernel's partial outputs are complete and visible past this point
    if BLOCK_S <= CHUNK_S:
        # every split's output loaded with the lses: one memory round trip before the arithmetic (the
        # chunk loop below waits for the lses' reduction before its first output load)
        o = tl.load(Outs + splits[:, None].to(tl.int64) * stride_os + row * stride_or + offs_d[None, :],
                    mask=(splits < n_splits)[:, None] & d_ok[None, :], other=0.0)
    lse = tl.load(Lses + splits.to(tl.int64) * stride_ls + row, mask=splits < n_splits, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    # rows where every split is empty: keep -inf, weigh everything 0 (never -inf - -inf = NaN)
    lse_max_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.sum(tl.exp(lse - lse_max_safe), 0)
    merged_lse = tl.where(total == 0.0, float("-inf"), lse_max_safe + tl.log(tl.where(total == 0.0, 1.0, total)))
    inv_total = 1.0 / tl.where(total == 0.0, 1.0, total)

    if BLOCK_S <= CHUNK_S:
        w = tl.exp(lse - lse_max_safe) * inv_total
        acc = tl.sum(w[:, None] * o.to(tl.float32), 0)
    else:
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s0 in range(0, n_splits, CHUNK_S):
            s = s0 + tl.arange(0, CHUNK_S)
            s_ok = s < n_splits
            lse_s = tl.load(Lses + s.to(tl.int64) * stride_ls + row, mask=s_ok, other=float("-inf"))
            w = tl.exp(lse_s - lse_max_safe) * inv_total
            o = tl.load(Outs + s[:, None].to(tl.int64) * stride_os + row * stride_or + offs_d[None, :],
                        mask=s_ok[:, None] & d_ok[None, :], other=0.0)
            acc += tl.sum(w[:, None] * o.to(tl.float32), 0)
    tl.store(Out + row * HEAD_DIM + offs_d, acc.to(Out.dtype.element_ty), mask=d_ok)
    if LSE_BHM:
        h = row % nheads
        bm = row // nheads
        lse_idx = (bm // seqlen_q) * nheads * seqlen_q + h * seqlen_q + bm % seqlen_q
    else:
        lse_idx = row
    tl.store(Lse + lse_idx, merged_lse)
