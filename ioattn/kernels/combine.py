"""Merge of split-KV partial results (Flash-Decoding's combine): one program per row, all of the
row's splits loaded at once (a loop over splits would pay one memory latency per split; a decode
step has few rows and tens of splits). Reference twin: ``ioattn.reference.merge.merge_states_ref``.

``USE_PDL`` (Hopper, launched with programmatic dependent launch after the split kernel): the merge
grid is resident before the split kernel ends and waits in ``gdc_wait`` until its writes are
visible, so the launch gap between the two kernels of a decode step is hidden."""
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
                        sk_total=0, sk_programs=0, sk_chunks=0, group=1,
                        HEAD_DIM: tl.constexpr = 128, BLOCK_D: tl.constexpr = 128, BLOCK_S: tl.constexpr = 2,
                        CHUNK_S: tl.constexpr = 2, LSE_BHM: tl.constexpr = False, USE_PDL: tl.constexpr = False,
                        STREAM_K: tl.constexpr = False):
    """Rows are the flattened leading dims of the outputs; ``BLOCK_S`` >= n_splits, the outputs are
    read ``CHUNK_S`` splits at a time. ``LSE_BHM``: the rows are (batch, seqlen_q, nheads) and the
    merged lse goes out in flash-attn's (batch, nheads, seqlen_q) layout (the decode path).
    ``STREAM_K`` (decode, one row block per unit): a row's unit (batch element, KV head) was cut into
    as many pieces as programs of the decode kernel's stream-K partition held its chunks (``sk_total``
    chunks over ``sk_programs`` programs, ``sk_chunks`` a unit): one piece means the decode kernel
    wrote this row's result itself, and the row is left alone."""
    row = tl.program_id(0).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    live = row >= 0  # a true scalar: every row is merged, except whole stream-K units
    if STREAM_K:
        unit = (row // (seqlen_q * nheads)) * (nheads // group) + (row % nheads) // group
        first = unit * sk_chunks
        p_first = ((first + 1) * sk_programs - 1) // sk_total
        p_last = ((first + sk_chunks) * sk_programs - 1) // sk_total
        live = p_last > p_first
        n_splits = tl.where(live, p_last - p_first + 1, 0)  # nothing to load for a whole unit
    if USE_PDL:
        gdc_wait()  # the split kernel's partial outputs are complete and visible past this point
    lse = tl.load(Lses + splits.to(tl.int64) * stride_ls + row, mask=splits < n_splits, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    # rows where every split is empty: keep -inf, weigh everything 0 (never -inf - -inf = NaN)
    lse_max_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.sum(tl.exp(lse - lse_max_safe), 0)
    merged_lse = tl.where(total == 0.0, float("-inf"), lse_max_safe + tl.log(tl.where(total == 0.0, 1.0, total)))
    inv_total = 1.0 / tl.where(total == 0.0, 1.0, total)

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_splits, CHUNK_S):
        s = s0 + tl.arange(0, CHUNK_S)
        s_ok = s < n_splits
        lse_s = tl.load(Lses + s.to(tl.int64) * stride_ls + row, mask=s_ok, other=float("-inf"))
        w = tl.exp(lse_s - lse_max_safe) * inv_total
        o = tl.load(Outs + s[:, None].to(tl.int64) * stride_os + row * stride_or + offs_d[None, :],
                    mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        acc += tl.sum(w[:, None] * o.to(tl.float32), 0)
    tl.store(Out + row * HEAD_DIM + offs_d, acc.to(Out.dtype.element_ty), mask=d_ok & live)
    if LSE_BHM:
        h = row % nheads
        bm = row // nheads
        lse_idx = (bm // seqlen_q) * nheads * seqlen_q + h * seqlen_q + bm % seqlen_q
    else:
        lse_idx = row
    tl.store(Lse + lse_idx, merged_lse, mask=live)
