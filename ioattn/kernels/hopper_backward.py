"""Hopper (sm_90) backward in Gluon. Two variants (``BWD_VARIANTS``), selected by
``hopper_backward(..., variant=...)``, both compiled for sm_90 ahead of time
(tools/compile_check_hopper_bwd.py) and run on the device by tests/gpu/test_gpu.py:

* ``"base"`` (``hopper_bwd_dkdv_kernel``): one program per (128-key block, batch * KV head), two
  warpgroups of 64 key rows, everything transposed (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK +=
  dS^T Q, dQ = dS K); dK / dV in registers, written once; dQ by fp32 atomics. Not dispatched.
* ``"ws"`` (``hopper_bwd_ws_kernel``): FlashAttention-3's backward structure on the same grid and math:
  a TMA producer warp (K / V once, Q and dO rings), the consumer warpgroups at 240 registers, and a dQ
  writer warp adding each step's fp32 block by a TMA bulk reduce-add; its ordered (deterministic) dQ
  mode, packed sequences, windows, softcap and ALiBi. At head dim 256 the two warpgroups split every
  product by its columns (``COL_SPLIT``). The dispatch's backward where ``ioattn.hopper.bwd_plan`` says so.

The design (the step's order, registers, shared memory, masks, the column split, the dQ hand-offs and
the deterministic protocol): docs/hopper-backward.md; each tuned table names its record in docs/decisions/.
"""
import functools

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ioattn import hopper as _host
from ioattn.dispatch import tma_rows_view
from ioattn.kernels import constants
from ioattn.kernels.backward import attn_bwd_preprocess_kernel, dq_from_blocks_kernel
from ioattn.kernels.hopper_forward import (ALIBI_MAGIC, LOG2E, MAGIC_BITS, _io_dim, _load_rows, _magic_to_f32,
                                          _prod_dim, _qk_mma, _softcap, _tile_layout,
                                          _zero_v_tail as _zero_rows_from)

BWD_VARIANTS = ("base", "ws")
# head dims each variant compiles for ("ws" at 256: its column-split form, docs/hopper-backward.md)
BWD_VARIANT_HEADDIMS = {"base": (64, 128), "ws": (64, 128, 256)}
# Tiles, both variants and head dims (v1's, kept for ws so the A/B compares structure only):
BWD_BLOCK_M = 64    # query rows per step (the wgmma N of S^T / dP^T, the K of dV / dK): FA3's hdim-128 kBlockM
BWD_BLOCK_N = 128   # key rows per program (two warpgroups of 64): FA3's hdim-128 kBlockN
BWD_NUM_WARPS = 8   # the two (consumer) warpgroups: FA3's two MMA warpgroups at hdim 128
# "ws": Q / dO ring depth per head dim. d = 128: 2, FA3's hdim-128 backward (2 stages of Q and of dO):
# the load of step t + 2 is issued when step t releases its slot, a whole step ahead; a third stage
# fits (231104 B of the 232448 B a block may have) and measured level. d = 64: 3, from shared-memory
# arithmetic: a step does half the FLOPs of d = 128, so a third stage keeps about the same time ahead
# for the loads; 114 KiB. (Shared-memory figures: the compile check's.)
# d = 256 (the column-split form, COL_SPLIT): Q 2, dO 1. With K, V (32 KiB each at 64 keys), Q and dO
# tiles of 32 KiB, P^T and dS^T (8 KiB each) and the dQ staging, two dO stages and a half-width dQ buffer
# (32 KiB) come to 241 KiB, over the 227 KiB a block may have; the dO ring gives a stage (dO is read first
# by dP^T, which waits behind S^T, and its slot is released once dV retires, mid-step) rather than Q
# (read by S^T at the step's start, released only when dK retires at its end). (Q / dO stages.)
# tuned: docs/decisions/backward-ws-step.md
WS_STAGES = {64: (3, 3), 128: (2, 2), 256: (2, 1)}
# "ws" at these head dims: the column-split form (``_ws_consumer_dsplit``), 64 keys a program
WS_COL_SPLIT_HEADDIMS = (256,)
WS_COL_SPLIT_BLOCK_N = 64
# "ws" with a score softcap (``SOFTCAP``): also the column-split form at these head dims (an A/B
# switch). The key split at d = 128 holds 238 of its 240 registers a thread without the cap; the cap's
# tanh beside P^T spills there (more with a window), where the column split compiles to ~150 registers,
# no spill; the key split is still the faster (the column split reads every Q / dO tile and adds every
# dQ block twice as often per key). tuned: docs/decisions/softcap.md
WS_SOFTCAP_COL_SPLIT_HEADDIMS = ()
# "ws": the swizzle of the fp32 dQ staging tile (bytes). The consumers store it from the wgmma
# accumulator layout, 8 B a thread, a warp's rows r..r+7 at 32 B each; with the 128 B swizzle (the
# default for the shape) rows r and r ^ 1 of a half-warp land on the same banks (2 wavefronts where 1
# would do); with 32 B, four rows fill one 128 B line and the stores are conflict-free, at 8 columns a
# bulk reduce message instead of 32 (16 messages a d=128 block). d=256 keeps 128 B: its writer warp
# (24 registers) spills issuing 2 x 16 messages a step. (The swizzled tile is the A/B arm of
# ``WS_DQ_FLAT``.) tuned: docs/decisions/backward-dq-path.md
WS_DQ_SWIZZLE = {64: 32, 128: 32, 256: 128}
# "ws": the fp32 dQ staging tile in the accumulator's own order ("flat"), an A/B switch by head dim (the
# key-split form only). Each thread's four values of one 8-column group (two adjacent columns, two rows
# 8 apart) become 16 contiguous bytes and a warp's 32 threads 512 contiguous bytes: one conflict-free
# STS.128 where the swizzled 2-D tile takes two STS.64. The writer's bulk reduce-add then reads the
# tile as a dense [BLOCK_M * d / 32, 32] box into a dQ accumulator kept in the same order, one 32 KB
# region per (batch, head, query block): whole 128 B rows a message where the 32 B swizzle sends
# 32 B pieces (the L2 takes one request a sector, and its crossbar input was the busiest unit). The
# host puts dQ back in (batch, seqlen, heads, d) order in its scaling pass (``dq_from_flat``). False: the
# swizzled tile (ab_bwd's "gluon-ws-dq32"). tuned: docs/decisions/backward-dq-path.md
WS_DQ_FLAT = {64: True, 128: True}
# "ws": lse folded into S^T's accumulator (by head dim, the key-split form only): the host
# pads lse / softmax_scale instead of lse * log2 e, S^T's product starts at minus it and the
# exponentials are exp2(S^T * softmax_scale * log2 e). The lse read moves from after the step's first
# two products (where it queued behind their shared-memory reads and the first FFMA of the
# exponentials waited on it) to the step's start, before S^T is issued. fp32 accumulation of minus
# lse / scale plus the products: an absolute error ~1e-6 of the exponent, far below bf16's. Off at
# d = 64, whose BLOCK_M = 128 puts 32 lse values a thread, beside D's 32, ahead of the step's first
# products. tuned: docs/decisions/backward-ws-step.md
WS_LSE_IN_ACC = {64: False, 128: True}
# "ws": each consumer warpgroup its own partition (by head dim; the key-split form with the flat dQ
# tile; an A/B switch). In one 8-warp partition every release (and Triton's barrier before each
# arrive) is a barrier over both warpgroups, so each step holds them in lockstep four times: a
# warpgroup waits for the other's dV, dQ and dK to retire. In two 4-warp partitions the barriers are
# each warpgroup's own; they meet once a step, at dS^T's exchange (an mbarrier of count 2: both halves
# stored before either dQ product reads them), and the rings' and the dQ hand-off's barriers count
# both. Each warpgroup computes dQ's half (columns at 64 query rows a step, rows at 128) into its own
# staging buffer (the halves of the flat tile: the writer adds them as two bulk copies). Before a
# warpgroup overwrites its dS^T half, the other's previous dQ must have read it: it waits for the
# previous step's dQ hand-off by both (``dq_full``). Off at d = 64 (128 rows a step: the releases'
# barriers are a smaller share there). tuned: docs/decisions/backward-ws-step.md
WS_WG_PARTITIONS = {64: False, 128: True}
# "ws": query rows a step by head dim (the key-split form; the column split needs 64). 128 at d = 64
# doubles a step's products (S^T / dP^T 64 keys x 128 queries a warpgroup) against the same per-step
# costs (barriers, hand-offs, waits), at d = 128's register count with D in dP^T's accumulator. d = 128
# at 128 rows would need 64 more registers a thread. tuned: docs/decisions/backward-ws-step.md
WS_BLOCK_M = {64: 128, 128: 64, 256: 64}
# "ws" with a score softcap (``SOFTCAP``) or ALiBi (``ALIBI``): query rows a step where they differ
# from ``WS_BLOCK_M``. At d = 64 the 128-row step spills with the cap (the tanh beside P^T's 64
# registers a thread, ptxas 12.8 via compile_check_hopper_bwd.py --softcap) and sits at the register
# limit with ALiBi (the query columns as fp32; it spills packed or deterministic causal); 64 rows
# compile without spills with either or both. tuned: docs/decisions/softcap.md, docs/decisions/alibi.md
WS_SCORE_MOD_BLOCK_M = {64: 64}
# "ws": dK / dV written as whole-row 16-byte stores (the accumulator layout writes half of each 32 B
# sector a store). The key-split form (d = 64 / 128) converts them in registers through shared memory
# (``_store_dkdv``'s ``COALESCED``). The column-split form (d = 256) has no shared memory left for the
# conversion's 64 KB: it stages them through its Q ring, free after the loop (``_store_dkdv_staged``).
# False: the accumulator-layout stores (ab_bwd's "gluon-ws-accstore").
# tuned: docs/decisions/backward-ws-step.md
WS_COALESCED_STORE = True
# "ws", the column-split form: the products' widths (``PROD_DIM``, 256 for the native d = 256) at which
# dQ's high half (staged in the step's Q slot) goes to the writer before the low half, the slot
# released as soon as it is read (``DQ_HI_FIRST``: ``_ws_consumer_dsplit``, ``_ws_dq_writer``; the low
# half first keeps the slot until after both halves' stores and reads, but its store runs beside dK
# and the high half's products). ab_bwd's "gluon-ws-dqhifirst" / ab_padded's "gluon-pad-dqlofirst" time
# the other order. tuned: docs/decisions/split-products.md
WS_DQ_HI_FIRST = (192,)


def dq_hi_first(d: int, col_split: bool, prod_dim: int) -> bool:
    """The ws kernel's ``DQ_HI_FIRST`` for head dim ``d`` (the column split's, ``col_split``) at the
    launcher's ``PROD_DIM`` (0: the whole head dim): ``WS_DQ_HI_FIRST``'s choice by product width."""
    return bool(col_split) and (prod_dim or d) in WS_DQ_HI_FIRST


# "ws": registers of the producer and dQ-writer warps (setmaxnreg dec): FA3's producer budget, 24.
# The consumer partition gets (65536 - 24 * 128) / 256 = 244 -> 240 (Triton rounds to a multiple of 8),
# FA3's 240 for two MMA warpgroups.
WS_WORKER_REGS = gl.constexpr(24)
# the consumers' registers, (65536 - 24 * 128) / 256 (above): set for warpgroup 1's own partition with
# ``WS_WG_PARTITIONS`` (the default partition, warpgroup 0, gets the rest, the same)
WS_CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _issue_q_do(q_desc, do_desc, q_smem, do_smem, bar, t, m_lo, n_m, h0, b, seqlen_q,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
    """TMA loads of step ``t``'s Q and dO tiles (query head h0 + t // n_m, block m_lo + t % n_m) into
    slot t % 2; both complete on that slot's barrier."""
    s = t % 2
    h = h0 + t // n_m
    row = b * seqlen_q + (m_lo + t % n_m) * BLOCK_M
    col = h * HEAD_DIM
    mbarrier.expect(bar.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row, col], bar.index(s), q_smem.index(s))
    tma.async_copy_global_to_shared(do_desc, [row, col], bar.index(s), do_smem.index(s))


@gluon.jit
def _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d,
           MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, LSE_IN_ACC: gl.constexpr = False,
           WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
           DTYPE: gl.constexpr = None, ALIBI: gl.constexpr = False, alibi_a=0.0):
    """P^T of one (BLOCK_N keys x BLOCK_M queries) tile, fp32, masked entries 0; ``lse_log2`` one
    value per query (column), in S^T's column layout. ``LSE_IN_ACC``: ``s`` is already S^T - lse /
    softmax_scale (``WS_LSE_IN_ACC``), ``lse_log2`` unused. ``WINDOW`` (``IS_CAUSAL`` False): key j
    visible to query i iff i + off - win_left <= j <= i + off + win_right (off = seqlen_k - seqlen_q).
    ``SOFTCAP``: ``s`` is t = tanh(S^T * softmax_scale / cap) (``qk_scale`` cap * log2 e), and the result
    the pair (P^T in ``DTYPE``, dV's operand; P^T (1 - t^2), the fp32 factor dS^T is formed from), both
    formed here so that t dies with P^T's fp32 tile (held longer, it spilled). ``ALIBI``: flash-attn's
    bias added to ``s`` for the exponent (the tanh's derivative takes t itself), alibi_a = -slope in the
    units of ``s``; ``ALIBI_FP32_COLS``: the query columns as fp32 from this step's ``m_start``;
    ``ALIBI_MAGIC``: the forward's magic-number distance with the queries split as hi (a constant per
    register) and lo (one value per thread), the masks' query tests on hi too."""
    z = s  # the exponent's scores: with ALiBi biased
    if ALIBI == ALIBI_MAGIC:  # the distance (query + off - key) by the forward's magic-number conversion
        rel = seqlen_k - seqlen_q - n_start + m_start + MAGIC_BITS - keys_1d  # each key row's, biased
        hi = queries_1d & ~6  # a constant per register (as the forward's ``_alibi``)
        lo = queries_1d & 6  # one value per thread
        d = _magic_to_f32((rel[:, None] + lo[None, :]) + hi[None, :])
        z = s + alibi_a * gl.abs(d)
    elif ALIBI:
        rel = (seqlen_k - seqlen_q - n_start - keys_1d).to(gl.float32)  # each key row's - key + off
        queries_f = (m_start + queries_1d).to(gl.float32)
        z = s + alibi_a * gl.abs(rel[:, None] + queries_f[None, :])
    if LSE_IN_ACC:
        p = gl.exp2(z * qk_scale)
    else:
        p = gl.exp2(z * qk_scale - lse_log2[None, :])
    if MASKED:
        keys = (n_start + keys_1d)[:, None]
        queries = (m_start + queries_1d)[None, :]
        if ALIBI == ALIBI_MAGIC:  # the queries split as the bias's (hi per register, lo per thread): no column vector
            qhi = (queries_1d & ~6)[None, :]
            qlo = (queries_1d & 6)[None, :]
            first = keys - (seqlen_k - seqlen_q) - m_start - qlo  # hi of the query on this key's diagonal
            keep = (keys < seqlen_k) & (qhi < seqlen_q - m_start - qlo)
            if IS_CAUSAL:
                keep = keep & (qhi >= first)
            if WINDOW:
                keep = keep & (qhi >= first - win_right) & (qhi <= first + win_left)
        else:
            keep = (keys < seqlen_k) & (queries < seqlen_q)
            if IS_CAUSAL:
                keep = keep & (keys <= queries + (seqlen_k - seqlen_q))
            if WINDOW:
                keep = keep & (keys <= queries + (seqlen_k - seqlen_q + win_right))
                keep = keep & (keys >= queries + (seqlen_k - seqlen_q - win_left))
        p = gl.where(keep, p, 0.0)  # a select: also drops any inf formed from a masked entry's score
    if SOFTCAP:
        out = (p.to(DTYPE), p * (1.0 - s * s))
    else:
        out = p
    return out


@gluon.constexpr_function
def _acc_layout(num_warps, cols):
    """wgmma accumulator layout of a (key rows x ``cols``) product: keys split over every warp (S^T,
    dP^T with ``cols`` = BLOCK_M; dK, dV with ``cols`` = HEAD_DIM)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, cols, 16])


@gluon.jit
def _cols_mma(a_smem, b_tile, acc, acc_hi):
    """Issue acc += A B[:, 0:128] and acc_hi += A B[:, 128:128 + acc_hi's columns] asynchronously (two
    commit groups): a product over 192 of a 256-wide tile's columns (``_ws_consumer_dsplit``)."""
    lo = warpgroup_mma(a_smem, b_tile.slice(0, acc.shape[1], dim=1), acc, is_async=True)
    hi = warpgroup_mma(a_smem, b_tile.slice(acc.shape[1], acc_hi.shape[1], dim=1), acc_hi, is_async=True)
    return lo, hi


@gluon.constexpr_function
def _dq_layout(num_warps, head_dim):
    """Accumulator of a 64-row product whose ``head_dim`` columns the warpgroups split: dQ (64 query
    rows x d) in both kernels; in the column-split kernel every product (S^T, dP^T: 64 keys x 64
    queries; dK, dV: 64 keys x d; a dQ half)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                     instr_shape=[16, head_dim // (num_warps // 4), 16])


@gluon.constexpr_function
def _dq_acc_layout(num_warps, block_m, head_dim):
    """The key-split consumers' dQ accumulator (``block_m`` query rows x ``head_dim``): at 64 rows the
    warpgroups split the columns (``_dq_layout``), at 128 the rows (``_acc_layout``)."""
    if block_m == 64:
        return _dq_layout(num_warps, head_dim)
    return _acc_layout(num_warps, head_dim)


@gluon.constexpr_function
def _ws_dq_acc_layout(num_warps, block_m, head_dim, wg_split):
    """The ws consumers' dQ accumulator: ``_dq_acc_layout``; with ``wg_split`` (``WS_WG_PARTITIONS``: a
    warpgroup a partition) one warpgroup's half, 64 rows x (head_dim / 2 at 64 query rows a step, else
    head_dim)."""
    if wg_split:
        return _acc_layout(num_warps, head_dim // 2 if block_m == 64 else head_dim)
    return _dq_acc_layout(num_warps, block_m, head_dim)


@gluon.constexpr_function
def dq_flat_bases(num_warps, block_m, head_dim):
    """The flat dQ tile's order (``WS_DQ_FLAT``): for each bit of the shared-memory offset (in fp32
    elements), lowest first, the (row, column) of the [block_m, head_dim] block it steps, one bit of
    one coordinate each (a permutation of the coordinates' bits). The order follows the accumulator
    layout (``_dq_acc_layout``: wgmma m64nN tiles, warps_per_cta [WM, WN]): a thread's column pair
    and row + 8 first (its four registers of one 8-column group), then the lane (columns +2, +4;
    rows +1, +2, +4), then the thread's 8-column groups, then the warps (rows +16, +32, ...; then
    the column halves)."""
    wn = num_warps // 4 if block_m == 64 else 1
    wm = num_warps // wn
    instr_n = head_dim // wn
    bases = [[0, 1], [8, 0], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    bases += [[0, 8 << i] for i in range((instr_n // 8).bit_length() - 1)]
    bases += [[16 << i, 0] for i in range(wm.bit_length() - 1)]
    bases += [[0, instr_n << i] for i in range(wn.bit_length() - 1)]
    assert 1 << len(bases) == block_m * head_dim and 16 * wm == block_m, (num_warps, block_m, head_dim)
    return bases


@gluon.constexpr_function
def _dq_flat_layout(num_warps, block_m, head_dim):
    """Shared layout of the flat dQ staging tile (``dq_flat_bases``), 128 B aligned for the bulk copy."""
    return gl.SharedLinearLayout(offset_bases=dq_flat_bases(num_warps, block_m, head_dim), alignment=128)


@gluon.jit
def _key_block(nheads_kv, BLOCK_N: gl.constexpr, REVERSED: gl.constexpr = False):
    """This program's (batch, KV head, first key) from the grid (key blocks, batch * KV heads);
    ``REVERSED``: the key blocks in reverse grid order (the last one launched first)."""
    bh = gl.program_id(1)
    n = gl.program_id(0)
    if REVERSED:
        n = gl.num_programs(0) - 1 - n
    return bh // nheads_kv, bh % nheads_kv, n * BLOCK_N


@gluon.jit
def _store_dkdv(dK, dV, dk, dv, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, kv_layout: gl.constexpr,
                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, COALESCED: gl.constexpr = False,
                IO_DIM: gl.constexpr = 0):
    """The key block's dK (times softmax_scale) and dV, fp32 accumulators in ``kv_layout``, stored in
    the inputs' dtype with masked pointer stores (keys past seqlen_k are not written): both kernels'
    epilogue. ``COALESCED``: converted first (through shared memory) to rows of 16-byte pieces, one a
    thread, so a warp writes whole rows (the accumulator layout writes 4 B a thread, half of each
    32 B sector a message). ``IO_DIM``: the gradients' head dim where it is below HEAD_DIM (``_io_dim``;
    the tile's columns past it, zero, are not stored)."""
    if COALESCED:
        num_warps: gl.constexpr = gl.num_warps()
        row_threads: gl.constexpr = HEAD_DIM // 8
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // row_threads, row_threads], [num_warps, 1], [1, 0])
        _store_rows(dV, dv.to(dV.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k, st_layout, HEAD_DIM,
                    BLOCK_N, IO_DIM)
        _store_rows(dK, (dk * softmax_scale).to(dK.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k,
                    st_layout, HEAD_DIM, BLOCK_N, IO_DIM)
    else:
        _store_rows(dV, dv.to(dV.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k, kv_layout, HEAD_DIM,
                    BLOCK_N, IO_DIM)
        _store_rows(dK, (dk * softmax_scale).to(dK.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k,
                    kv_layout, HEAD_DIM, BLOCK_N, IO_DIM)


@gluon.jit
def _store_rows(ptr, x, k_row0, h_kv, nheads_kv, n_start, seqlen_k, layout: gl.constexpr, HEAD_DIM: gl.constexpr,
                BLOCK_N: gl.constexpr, IO_DIM: gl.constexpr = 0):
    """One (BLOCK_N keys x HEAD_DIM) tile ``x`` into the (rows, nheads_kv, HEAD_DIM) gradient at this key
    block (``k_row0``: the row of the sequence's key 0, b * seqlen_k, or cu_seqlens_k[b] when varlen), in
    ``layout``, keys past the sequence's seqlen_k masked. ``IO_DIM`` (``_io_dim``): the gradient is
    (rows, nheads_kv, IO_DIM), the tile's columns past it not stored."""
    D_IO: gl.constexpr = _io_dim(HEAD_DIM, IO_DIM)
    x = gl.convert_layout(x, layout)
    out_keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    out_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    out_base = ((k_row0 + n_start).to(gl.int64) * nheads_kv + h_kv) * D_IO
    offs = out_keys[:, None] * (nheads_kv * D_IO) + out_cols[None, :]
    key_ok = (n_start + out_keys < seqlen_k)[:, None]
    if IO_DIM:
        gl.store(ptr + out_base + offs, x, mask=key_ok & (out_cols < IO_DIM)[None, :])
    else:
        gl.store(ptr + out_base + offs, x, mask=key_ok)


@gluon.jit
def _step_probs(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d, queries_1d,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                LSE_IN_ACC: gl.constexpr = False, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                SOFTCAP: gl.constexpr = False, DTYPE: gl.constexpr = None, ALIBI: gl.constexpr = False,
                alibi_a=0.0):
    """``_probs`` with the masks only where this step's tile needs them: keys past seqlen_k (not
    ``keys_inside``), queries past seqlen_q, or (causal) a tile the diagonal crosses (``off`` =
    seqlen_k - seqlen_q); ``WINDOW``: also a tile either edge of the window crosses."""
    need_mask = (not keys_inside) | (m_start + BLOCK_M > seqlen_q)
    if IS_CAUSAL:
        need_mask = need_mask | (n_start + BLOCK_N - 1 > m_start + off)
    if WINDOW:
        need_mask = need_mask | (n_start + BLOCK_N - 1 > m_start + off + win_right)
        need_mask = need_mask | (n_start < m_start + BLOCK_M - 1 + off - win_left)
    if need_mask:
        p = _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d, True,
                   IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP, DTYPE, ALIBI, alibi_a)
    else:
        p = _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d, False,
                   IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP, DTYPE, ALIBI, alibi_a)
    return p


@gluon.jit
def hopper_bwd_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, Lse, Delta, DQacc, dK, dV,
                           seqlen_q, seqlen_k, nheads, group,
                           stride_lse_b, stride_lse_h, stride_delta_b, stride_delta_h,
                           softmax_scale, qk_scale,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           IS_CAUSAL: gl.constexpr):
    """Grid (cdiv(seqlen_k, BLOCK_N), batch * nheads_kv), num_warps = BLOCK_N // 16 (two warpgroups
    at BLOCK_N = 128). Descriptors: Q, dO blocks [BLOCK_M, HEAD_DIM]; K, V blocks [BLOCK_N, HEAD_DIM].
    dK, dV: contiguous (batch, seqlen_k, nheads_kv, HEAD_DIM) in the input dtype; DQacc: contiguous
    (batch, seqlen_q, nheads, HEAD_DIM) fp32, zeroed, receives the unscaled dS K sums."""
    num_warps: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_N == 16 * num_warps, "one 16-row wgmma slice of the key block per warp")
    gl.static_assert(num_warps % 4 == 0, "whole warpgroups")
    gl.static_assert(BLOCK_M == 64, "the dQ product's M: one 64-row wgmma tile")
    dtype: gl.constexpr = q_desc.dtype

    nheads_kv = nheads // group
    b, h_kv, n_start = _key_block(nheads_kv, BLOCK_N)
    off = seqlen_k - seqlen_q  # causal: key j visible to query i iff j <= i + off

    # layouts: keys x queries (S^T, dP^T), keys x d (dK, dV), queries x d (dQ: the two warpgroups
    # split d)
    st_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_M)
    kv_layout: gl.constexpr = _acc_layout(num_warps, HEAD_DIM)
    dq_layout: gl.constexpr = _dq_layout(num_warps, HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    keys_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    queries_1d = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    rows_1d = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)

    # shared memory and barriers
    k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ds_layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    qdo_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(qdo_bar.index(i), count=1)
    fence_async_shared()

    # the query blocks that see this key block: causal from the first row reaching its first key
    n_m_total = gl.cdiv(seqlen_q, BLOCK_M)
    m_lo = 0
    if IS_CAUSAL:
        m_lo = gl.minimum(gl.maximum(n_start - off, 0) // BLOCK_M, n_m_total)
    n_m = n_m_total - m_lo
    n_iter = group * n_m
    h0 = h_kv * group

    kv_row = b * seqlen_k + n_start
    kv_col = h_kv * HEAD_DIM
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, kv_col], kv_bar, k_smem.index(0))
    tma.async_copy_global_to_shared(v_desc, [kv_row, kv_col], kv_bar, v_smem.index(0))
    if n_iter > 0:
        _issue_q_do(q_desc, do_desc, q_smem, do_smem, qdo_bar, 0, m_lo, n_m, h0, b, seqlen_q, HEAD_DIM, BLOCK_M)
    mbarrier.wait(kv_bar, 0)

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    dq_rows_1d = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols_1d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    # tiles needing no mask: the key block inside seqlen_k, the query block inside seqlen_q and
    # (causal) its first query row at or past the key block's last key
    keys_inside = n_start + BLOCK_N <= seqlen_k

    for t in range(n_iter):
        # next step's Q / dO into the other slot (free: docs/hopper-backward.md, "The base kernel")
        if t + 1 < n_iter:
            _issue_q_do(q_desc, do_desc, q_smem, do_smem, qdo_bar, t + 1, m_lo, n_m, h0, b, seqlen_q, HEAD_DIM,
                        BLOCK_M)
        s_idx = t % 2
        h = h0 + t // n_m
        m_start = (m_lo + t % n_m) * BLOCK_M
        q_cur = q_smem.index(s_idx)
        # z == 0 always (t < n_iter) but opaque to LLVM: indexing the single-slot K, V and dS buffers
        # with it keeps their 16 + 16 wgmma descriptors (64-bit, one per k-step) computed inside the
        # loop. With a constant index LLVM hoists them (64 registers live across the loop at d = 128,
        # the spills of the first version); one 32-bit division per step instead.
        z = t // n_iter
        k_cur = k_smem.index(z)
        v_cur = v_smem.index(z)
        ds_cur = ds_smem.index(z)
        do_cur = do_smem.index(s_idx)

        # per-query rows: lse (natural log -> log2; -inf rows -> 0) and D; rows past seqlen_q -> 0.
        # Loaded compactly (one element per thread: one address register, not 16 per vector) and
        # spread to the columns of S^T after the products (a layout conversion through shared memory).
        q_idx = m_start + rows_1d
        q_ok = q_idx < seqlen_q
        lse_c = gl.load(Lse + b.to(gl.int64) * stride_lse_b + h.to(gl.int64) * stride_lse_h + q_idx, mask=q_ok,
                        other=0.0)
        lse_c = gl.where(lse_c == float("-inf"), 0.0, lse_c * LOG2E)
        delta_c = gl.load(Delta + b.to(gl.int64) * stride_delta_b + h.to(gl.int64) * stride_delta_h + q_idx,
                          mask=q_ok, other=0.0)

        mbarrier.wait(qdo_bar.index(s_idx), (t // 2) & 1)
        # S^T and dP^T issued together (both operands in shared memory); P^T from S^T (in place: the
        # fp32 S^T dies) while dP^T is in flight, then dS^T in place of dP^T. At most two fp32
        # 128 x 64 tiles (P^T, dP^T) live next to dK, dV (the register budget, see the docstring).
        s_tok = warpgroup_mma(k_cur, q_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v_cur, do_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        lse_log2 = gl.convert_layout(lse_c, gl.SliceLayout(0, st_layout))
        p = _step_probs(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                        queries_1d, BLOCK_M, BLOCK_N, IS_CAUSAL)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        delta = gl.convert_layout(delta_c, gl.SliceLayout(0, st_layout))
        # dS^T = P^T (dP^T - D) from the fp32 P^T (as the portable backward): 0 wherever P^T was masked
        # to 0 (dP^T is finite: products of finite rows)
        ds16 = (p * (dp - delta[None, :])).to(dtype)
        pa = gl.convert_layout(p.to(dtype), a_layout)
        dsa = gl.convert_layout(ds16, a_layout)
        dv_tok = warpgroup_mma(pa, do_cur, dv, is_async=True)
        dk_tok = warpgroup_mma(dsa, q_cur, dk, is_async=True)
        # the register A operands listed so that they stay alive until their products retire. Waited
        # here, before the barrier below: the slot argument (docs/hopper-backward.md) needs every warp's last
        # wgmma reading Q / dO of this step retired before any warp passes that barrier.
        dv, dk, pa, dsa = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, pa, dsa])

        # dS^T to shared memory for dQ = dS K. The first barrier: every warp is past its previous
        # step's dQ product (the WAR on ds_smem) and past this step's last reads of Q / dO, so the
        # slot is free for step t + 2, whose loads are issued at the start of step t + 1. The
        # second: all of dS^T (both warpgroups' halves) written and fenced before either reads it.
        gl.thread_barrier()
        ds_cur.store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        dq = warpgroup_mma(ds_cur.permute((1, 0)), k_cur, dq_zero, use_acc=False)

        # a 64-bit scalar base and 32-bit offsets inside the tile (64 x 64-bit pointers per thread
        # would cost 64 registers next to dK and dV)
        dq_base = DQacc + ((b * seqlen_q + m_start).to(gl.int64) * nheads + h) * HEAD_DIM
        dq_offs = dq_rows_1d[:, None] * (nheads * HEAD_DIM) + dq_cols_1d[None, :]
        gl.atomic_add(dq_base + dq_offs, dq, mask=(m_start + dq_rows_1d < seqlen_q)[:, None], sem="relaxed")

    for i in gl.static_range(2):
        mbarrier.invalidate(qdo_bar.index(i))
    mbarrier.invalidate(kv_bar)

    _store_dkdv(dK, dV, dk, dv, b * seqlen_k, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, kv_layout, HEAD_DIM,
                BLOCK_N)


# ---------------------------------------------------------------------------------------------------
# Variant "ws": warp-specialised (FlashAttention-3's backward structure). See docs/hopper-backward.md.
# ---------------------------------------------------------------------------------------------------

@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``cp.reduce.async.bulk.tensor ... .add``: add the shared-memory tile ``src`` into the global
    tile of ``tensor_desc`` at ``coord``, asynchronously (one bulk-async group; ``tma.store_wait``
    waits for its reads of ``src``). Triton 3.6's Gluon builder has the op (AsyncTMAReduceOp) but its
    ``hopper.tma`` module exports no wrapper for it, so this is a four-line one in the module's own
    style (``tma.async_copy_shared_to_global`` with the reduce kind added). It uses Triton internals
    (the builder binding, ``_convert_to_ir_values``): a Triton upgrade may move them, and the sm_90
    compile test would then fail here first."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                 delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, tail_bar, b, h0, kv_row, kv_col, m_lo, n_m,
                 n_iter, q_row0, nheads, stat_stride, seqlen_q, seqlen_k, n_start, q_owned, k_owned,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 DO_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, IO_DIM: gl.constexpr = 0):
    """The 1-warp TMA producer: K and V of the key block once, then per step t (query head
    h0 + t // n_m, query block m_lo + t % n_m) Q with its lse row into slot t % STAGES of the Q ring
    (``q_ready``) and dO with its D row into slot t % DO_STAGES of the dO ring (``do_ready``), each
    after the consumers have released that slot's previous tile (``q_empty`` / ``do_empty``). Q / dO
    rows from ``q_row0`` (b * seqlen_q, or cu_seqlens_q[b] when varlen), K / V from ``kv_row``; the
    lse / D rows at (b, h, m_start) of the padded (batch, nheads, stat_stride). ``IS_VARLEN``: a tile
    reaching past ``q_owned`` / ``k_owned`` (the rows the sequences own) may read anything (0 x NaN is
    NaN in the products), so it lands on ``tail_bar``, this warp zeroes its rows past the sequence's end
    (the forward's ``_zero_v_tail``) and releases it by a plain arrive on its ready barrier.
    ``IO_DIM``: the tensors' head dim where it is below HEAD_DIM (``_io_dim``)."""
    tails = 0 * n_iter  # tiles on tail_bar so far (its phase); a runtime integer (loop-carried)
    if IS_VARLEN and kv_row + BLOCK_N > k_owned:
        mbarrier.expect(tail_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _load_rows(k_desc, kv_row, kv_col, tail_bar, k_smem.index(0))
        _load_rows(v_desc, kv_row, kv_col, tail_bar, v_smem.index(0))
        mbarrier.wait(tail_bar, 0)
        tails += 1
        _zero_rows_from(k_smem.index(0), seqlen_k - n_start, BLOCK_N, HEAD_DIM)
        _zero_rows_from(v_smem.index(0), seqlen_k - n_start, BLOCK_N, HEAD_DIM)
        mbarrier.arrive(kv_bar, count=1)
    else:
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _load_rows(k_desc, kv_row, kv_col, kv_bar, k_smem.index(0))
        _load_rows(v_desc, kv_row, kv_col, kv_bar, v_smem.index(0))
    for t in range(n_iter):
        s = t % STAGES
        reuse_phase = ((t // STAGES) & 1) ^ 1  # the consumers' release of this slot's previous tile
        if DO_STAGES == STAGES:
            s_do = s
            reuse_phase_do = reuse_phase
        else:
            s_do = t % DO_STAGES
            reuse_phase_do = ((t // DO_STAGES) & 1) ^ 1
        h = h0 + t // n_m
        m_start = (m_lo + t % n_m) * BLOCK_M
        row = q_row0 + m_start
        col = h * _io_dim(HEAD_DIM, IO_DIM)
        stat = (b * nheads + h) * stat_stride + m_start
        mbarrier.wait(q_empty.index(s), reuse_phase, pred=t >= STAGES)
        # Q and dO both through tail_bar, zeroed past the end. (Written out, not as one helper for both
        # tiles: that form compiled the varlen d = 256 producer with 20-36 B of spills, this one with none.)
        if IS_VARLEN and row + BLOCK_M > q_owned:
            mbarrier.expect(tail_bar, q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
            _load_rows(q_desc, row, col, tail_bar, q_smem.index(s))
            tma.async_copy_global_to_shared(lse_desc, [stat], tail_bar, lse_smem.index(s))
            mbarrier.wait(tail_bar, tails & 1)
            tails += 1
            _zero_rows_from(q_smem.index(s), seqlen_q - m_start, BLOCK_M, HEAD_DIM)
            mbarrier.arrive(q_ready.index(s), count=1)
            mbarrier.wait(do_empty.index(s_do), reuse_phase_do, pred=t >= DO_STAGES)
            mbarrier.expect(tail_bar, do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            _load_rows(do_desc, row, col, tail_bar, do_smem.index(s_do))
            tma.async_copy_global_to_shared(delta_desc, [stat], tail_bar, delta_smem.index(s_do))
            mbarrier.wait(tail_bar, tails & 1)
            tails += 1
            _zero_rows_from(do_smem.index(s_do), seqlen_q - m_start, BLOCK_M, HEAD_DIM)
            mbarrier.arrive(do_ready.index(s_do), count=1)
        else:
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
            _load_rows(q_desc, row, col, q_ready.index(s), q_smem.index(s))
            tma.async_copy_global_to_shared(lse_desc, [stat], q_ready.index(s), lse_smem.index(s))
            mbarrier.wait(do_empty.index(s_do), reuse_phase_do, pred=t >= DO_STAGES)
            mbarrier.expect(do_ready.index(s_do), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            _load_rows(do_desc, row, col, do_ready.index(s_do), do_smem.index(s_do))
            tma.async_copy_global_to_shared(delta_desc, [stat], do_ready.index(s_do), delta_smem.index(s_do))


@gluon.jit
def _bulk_complete_and_release(sem):
    """Wait until this thread's bulk async copies have completed (their writes performed, not only
    their shared-memory reads: ``tma.store_wait`` waits for the reads), order them before later
    generic-proxy accesses, then add 1 to ``sem`` with release semantics. Returns the old value."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\nfence.proxy.async.global;\nmov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)
    return gl.atomic_add(sem, 1, sem="release", scope="gpu")


@gluon.jit
def _ws_dq_writer(dq_desc, dq_smem, dq_full, dq_empty, q_smem, q_empty, dq_hi_full, Sem, b, h0, m_lo, n_m, n_iter,
                  q_row0, seqlen_q, seqlen_k, nheads, n_m_total, n_block, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, DETERMINISTIC: gl.constexpr, DQ_COLS: gl.constexpr,
                  STAGES: gl.constexpr, DQ_FLAT: gl.constexpr = False, dq_smem1=None,
                  WG_SPLIT: gl.constexpr = False, WINDOW: gl.constexpr = False, win_left=0, dq_hi_desc=None,
                  DQ_HI_FIRST: gl.constexpr = False):
    """The 1-warp dQ writer: per step, once the consumers have put the step's dQ block (fp32,
    unscaled) in ``dq_smem`` (``dq_full``), one TMA reduce-add of it into the dQ accumulator; when
    the bulk copy has read the tile, the buffer goes back to the consumers (``dq_empty``). ``DQ_COLS``
    < HEAD_DIM (the column split): the block in two halves, the high one announced on ``dq_hi_full``
    and read from step t's Q slot; both released (``dq_empty``, ``q_empty``) once both are read, so
    neither full barrier can complete twice before its wait (``DQ_HI_FIRST``: the high half first, the
    slot released as soon as it is read). ``DETERMINISTIC``: the reduce-adds into each (batch, head,
    query block) in a fixed key-block order by the counters in ``Sem`` (causal: descending, the key
    blocks launched in reverse). ``DQ_FLAT`` / ``WG_SPLIT``: the flat tile, in one or two boxes.
    ``n_m_total``: query blocks of one (batch, head) in the accumulator and ``Sem``; ``dq_hi_desc``: the
    64-column high half at the products over 192 columns. The protocols: docs/hopper-backward.md."""
    PIECES: gl.constexpr = HEAD_DIM // DQ_COLS  # 1; the column-split kernel's 2 halves
    FLAT_ROWS: gl.constexpr = BLOCK_M * HEAD_DIM // 32
    # the pieces' order: FIRST, FIRST + STEP, ... (the high half first with ``DQ_HI_FIRST``)
    FIRST: gl.constexpr = PIECES - 1 if DQ_HI_FIRST else 0
    STEP: gl.constexpr = -1 if DQ_HI_FIRST else 1
    for t in range(n_iter):
        h = h0 + t // n_m
        m = m_lo + t % n_m
        row = q_row0 + m * BLOCK_M
        for j in gl.static_range(FIRST, FIRST + STEP * PIECES, STEP):
            # piece j: columns [j * DQ_COLS, (j + 1) * DQ_COLS) of the block
            if j == 0:  # the dQ buffer; the column split's high half on its own barrier, in the Q slot
                mbarrier.wait(dq_full, t & 1)
            else:
                mbarrier.wait(dq_hi_full, t & 1)
            if DETERMINISTIC and j == FIRST:  # the order is per query block: wait once, before its first piece
                sem = Sem + (b * nheads + h) * n_m_total + m
                rank = n_block
                if IS_CAUSAL:  # the last key block reaching query block m goes first
                    last = gl.minimum(gl.cdiv(seqlen_k, BLOCK_N) - 1,
                                      (m * BLOCK_M + BLOCK_M - 1 + seqlen_k - seqlen_q) // BLOCK_N)
                    rank = last - n_block
                if WINDOW:  # ascending from the first key block reaching query block m (its left edge)
                    rank = n_block - gl.maximum(m * BLOCK_M + seqlen_k - seqlen_q - win_left, 0) // BLOCK_N
                while gl.atomic_add(sem, 0, sem="acquire", scope="gpu") != rank:
                    pass
            if WG_SPLIT:  # the two halves of the block's region
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS, 0],
                                dq_smem._reinterpret(gl.float32, [FLAT_ROWS // 2, 32], dq_desc.layout))
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS + FLAT_ROWS // 2, 0],
                                dq_smem1._reinterpret(gl.float32, [FLAT_ROWS // 2, 32], dq_desc.layout))
            elif DQ_FLAT:  # (batch, head, query block)'s region of the flat accumulator
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS, 0],
                                dq_smem._reinterpret(gl.float32, [FLAT_ROWS, 32], dq_desc.layout))
            elif j == 0:
                _tma_reduce_add(dq_desc, [row, h * HEAD_DIM], dq_smem)
            elif dq_hi_desc is None:
                _tma_reduce_add(dq_desc, [row, h * HEAD_DIM + j * DQ_COLS],
                                q_smem.index(t % STAGES)._reinterpret(gl.float32, [BLOCK_M, DQ_COLS], dq_smem.layout))
            else:
                _tma_reduce_add(dq_hi_desc, [row, h * HEAD_DIM + j * DQ_COLS],
                                q_smem.index(t % STAGES)._reinterpret(gl.float32, [BLOCK_M, DQ_COLS], dq_smem.layout)
                                .slice(0, dq_hi_desc.block_type.shape[1], dim=1))
            if DQ_HI_FIRST:
                if j == 1:  # the high half read: Q (and lse) slot back to the producer now
                    tma.store_wait(0)
                    mbarrier.arrive(q_empty.index(t % STAGES), count=1)
        # every piece read, then the buffers back: the low half's release (the consumers' next store)
        # follows the wait for the high half, so neither full barrier gets two phases ahead
        if DETERMINISTIC:  # every piece's additions complete, then the next key block
            _bulk_complete_and_release(sem)
        else:
            tma.store_wait(0)  # the pieces are read (their additions into L2 complete on their own)
        mbarrier.arrive(dq_empty, count=1)
        if PIECES == 2 and not DQ_HI_FIRST:
            mbarrier.arrive(q_empty.index(t % STAGES), count=1)  # Q (and lse) slot back to the producer


@gluon.jit
def _opaque_zero():
    """0, from an asm move LLVM cannot see through or hoist (not pure): an in-loop value that keeps
    loop-invariant address arithmetic inside the loop, for one instruction."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ws_consumer(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty,
                 do_ready, do_empty, dq_full, dq_empty, ds_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo, n_m,
                 n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                 COALESCED_STORE: gl.constexpr = False, LSE_IN_ACC: gl.constexpr = False,
                 WG_SPLIT: gl.constexpr = False, W: gl.constexpr = 0, WINDOW: gl.constexpr = False, win_left=0,
                 win_right=0, SOFTCAP: gl.constexpr = False, softcap_a=0.0, ALIBI: gl.constexpr = False,
                 Alibi_h0=None, alibi_unit=0.0, IO_DIM: gl.constexpr = 0):
    """The two consumer warpgroups (the default partition: the kernel's 8 warps, 64 key rows each, in
    lockstep as in the base kernel). The math per step is the base kernel's, in FA3's order (dV
    issued before dS is formed, dQ before dK: docs/hopper-backward.md); the loads come from the
    rings, and dQ goes to ``dq_smem`` for the writer warp instead of into atomics. ``LSE_IN_ACC``
    (``WS_LSE_IN_ACC``): the lse slot holds lse / softmax_scale and S^T's accumulator starts at minus
    it, so the exponentials need no shared-memory read after S^T retires. ``WG_SPLIT``
    (``WS_WG_PARTITIONS``): this is warpgroup ``W`` alone, in a partition of its own: key rows
    [64 W, 64 W + 64) of the block, dQ's half W into its own ``dq_smem``, the dS^T exchange on
    ``ds_full`` (unused otherwise). ``SOFTCAP``: the scores are cap * tanh(S * softcap_a) (the
    host's ``qk_scale`` cap * log2 e), dS^T times the tanh's derivative (``_probs``). ``ALIBI``: the
    slope of the step's query head read from ``Alibi_h0`` (the group's first head's, + the head's
    place in the group), times ``alibi_unit`` (-1 / softmax_scale, or -1 / cap), biases S^T (``_probs``)."""
    num_warps: gl.constexpr = gl.num_warps()
    # key rows this partition computes; dQ's part: columns (64 query rows a step) or rows (128)
    ROWS: gl.constexpr = BLOCK_N // 2 if WG_SPLIT else BLOCK_N
    DQ_M: gl.constexpr = BLOCK_M // 2 if WG_SPLIT and BLOCK_M == 128 else BLOCK_M
    DQ_N: gl.constexpr = HEAD_DIM // 2 if WG_SPLIT and BLOCK_M == 64 else HEAD_DIM
    dtype: gl.constexpr = k_smem.dtype
    # D subtracted inside dP^T's product (its accumulator starts at -D) at 128 query rows a step, where
    # D in S^T's column layout is 32 registers a thread, live across P^T's formation otherwise
    D_IN_ACC: gl.constexpr = BLOCK_M == 128
    off = seqlen_k - seqlen_q
    st_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_M)
    kv_layout: gl.constexpr = _acc_layout(num_warps, HEAD_DIM)
    dq_layout: gl.constexpr = _ws_dq_acc_layout(num_warps, BLOCK_M, HEAD_DIM, WG_SPLIT)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    keys_1d = gl.arange(0, ROWS, layout=gl.SliceLayout(1, st_layout))
    queries_1d = gl.arange(0, BLOCK_M, layout=col_layout)

    n_own = n_start + W * ROWS  # this partition's first key
    dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([ROWS, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([DQ_M, DQ_N], gl.float32, layout=dq_layout)
    keys_inside = n_own + ROWS <= seqlen_k
    mbarrier.wait(kv_bar, 0)

    # The step's query block is stepped by a counter (wrapping at each query head of the group) and
    # the in-loop zero comes from an asm move: ``t % n_m`` and ``t // n_iter`` were two integer
    # divisions a step on the path from dK's retirement to the next S^T, where the tensor cores
    # idle (docs/decisions/backward-ws-step.md)
    m_blk = m_lo
    h_in_group = 0  # the step's query head in the group (``ALIBI``'s slope)
    for t in range(n_iter):
        s_idx = t % STAGES
        phase = (t // STAGES) & 1
        m_start = m_blk * BLOCK_M
        alibi_a = 0.0
        if ALIBI:  # this step's head's slope, in the units of S^T (read early: a scalar load)
            alibi_a = gl.load(Alibi_h0 + h_in_group) * alibi_unit
        # z == 0, opaque to LLVM: keeps the K, V and dS wgmma descriptors inside the loop (the base
        # kernel's comment on ``z``)
        z = _opaque_zero()
        k_all = k_smem.index(z)
        ds_all = ds_smem.index(z)
        q_cur = q_smem.index(s_idx)
        do_cur = do_smem.index(s_idx)
        if WG_SPLIT:  # this warpgroup's key rows; dQ's operands for its half
            k_cur = k_all.slice(W * ROWS, ROWS)
            v_cur = v_smem.index(z).slice(W * ROWS, ROWS)
            ds_cur = ds_all.slice(W * ROWS, ROWS)
            if BLOCK_M == 64:  # dQ's columns [W * DQ_N, ...): all of dS, K's column half
                dq_a = ds_all.permute((1, 0))
                dq_b = k_all.slice(W * DQ_N, DQ_N, dim=1)
            else:  # dQ's rows [W * DQ_M, ...): dS's query half, all of K
                dq_a = ds_all.slice(W * DQ_M, DQ_M, dim=1).permute((1, 0))
                dq_b = k_all
        else:
            k_cur = k_all
            v_cur = v_smem.index(z)
            ds_cur = ds_all
            dq_a = ds_all.permute((1, 0))
            dq_b = k_all

        # S^T as soon as Q has landed, dP^T once dO has
        mbarrier.wait(q_ready.index(s_idx), phase)
        if LSE_IN_ACC:
            # S^T - lse / softmax_scale from the product itself: the lse read happens here, at the step's
            # start, not behind this step's products in the shared-memory queue, where the first FFMA
            # of the exponentials waited for it
            lse_s = lse_smem.index(s_idx).load(col_layout)
            s_tok = warpgroup_mma(k_cur, q_cur.permute((1, 0)), st_zero - lse_s[None, :], is_async=True)
        else:
            s_tok = warpgroup_mma(k_cur, q_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s_idx), phase)
        if D_IN_ACC:
            # dP^T - D from the product itself: the accumulator starts at -D (one value a query column),
            # so D's registers die before P^T's are formed (``D_IN_ACC``)
            delta = delta_smem.index(s_idx).load(col_layout)
            dp_tok = warpgroup_mma(v_cur, do_cur.permute((1, 0)), st_zero - delta[None, :], is_async=True)
        else:
            dp_tok = warpgroup_mma(v_cur, do_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        # lse (log2, -inf rows already 0, rows past seqlen_q 0: the host's padded copy) read from its
        # slot straight into S^T's column layout (a broadcast shared-memory read)
        if LSE_IN_ACC:
            lse_log2 = lse_s  # unused
        elif not SOFTCAP:
            lse_log2 = lse_smem.index(s_idx).load(col_layout)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if SOFTCAP:
            s = _softcap(s, softcap_a)
            lse_log2 = lse_smem.index(s_idx).load(col_layout)
        if SOFTCAP:  # the 16-bit P^T and, as ``p``, the fp32 P^T times the tanh's derivative (``_probs``)
            p16, p = _step_probs(s, lse_log2, qk_scale, n_own, m_start, off, keys_inside, seqlen_q, seqlen_k,
                                 keys_1d, queries_1d, BLOCK_M, ROWS, IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left,
                                 win_right, True, dtype, ALIBI, alibi_a)
        else:
            p = _step_probs(s, lse_log2, qk_scale, n_own, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                            queries_1d, BLOCK_M, ROWS, IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, False,
                            None, ALIBI, alibi_a)
            p16 = p.to(dtype)
        pa = gl.convert_layout(p16, a_layout)
        # dV += P^T dO queued behind dP^T: it runs while dS is formed and stored below
        dv_tok = warpgroup_mma(pa, do_cur, dv, is_async=True)
        if D_IN_ACC:
            dp = warpgroup_mma_wait(1, deps=[dp_tok])
            ds16 = (p * dp).to(dtype)
        else:
            delta = delta_smem.index(s_idx).load(col_layout)
            dp = warpgroup_mma_wait(1, deps=[dp_tok])
            ds16 = (p * (dp - delta[None, :])).to(dtype)
        dsa = gl.convert_layout(ds16, a_layout)
        # dS^T to shared memory for dQ = dS K. No barrier needed before the store (WAR on ds_smem):
        # every warp passed the previous step's last barrier after its dQ product had retired;
        # ``WG_SPLIT``: the other warpgroup's previous dQ too, once both handed it over (``dq_full``)
        if WG_SPLIT:
            mbarrier.wait(dq_full, (t & 1) ^ 1, pred=t > 0)
        ds_cur.store(ds16)
        fence_async_shared()
        # both warpgroups' halves of dS^T written (``WG_SPLIT``: this one's) before either product reads them
        gl.thread_barrier()
        if WG_SPLIT:  # the other warpgroup's half: its arrive on ds_full (count 2)
            mbarrier.arrive(ds_full, count=1)
            mbarrier.wait(ds_full, t & 1)
        # dQ first, then dK: dQ retires first and is handed to the writer warp while dK runs
        dq_tok = warpgroup_mma(dq_a, dq_b, dq_zero, use_acc=False, is_async=True)
        dk_tok = warpgroup_mma(dsa, q_cur, dk, is_async=True)

        # Releases, as the wgmma groups (retiring in order: dV, dQ, dK) allow. Each arrive is one
        # thread's, after a barrier over the partition's warps (8: both warpgroups' products retired;
        # ``WG_SPLIT``: this warpgroup's 4, the barrier counting both partitions' arrives; Triton adds
        # one before every arrive anyway: it orders the arrive after all shared-memory
        # accesses). The dO slot has no barrier of its own: it goes back with the dQ block, after both
        # warpgroups' dQ (and so dV, which retires before it) has retired: one barrier a step fewer than
        # a release of its own as soon as dV retires (docs/decisions/backward-dq-path.md)
        dv, pa, dq = warpgroup_mma_wait(1, deps=[dv_tok, pa, dq_tok])
        # the dQ block to the writer warp: wait until it has read the previous one (handed over a
        # whole step ago: normally long done), store, fence for the bulk copy, hand over
        mbarrier.wait(dq_empty, (t & 1) ^ 1, pred=t > 0)
        dq_smem.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(do_empty.index(s_idx), count=1)  # dO and D done with
        mbarrier.arrive(dq_full, count=1)
        dk, dsa = warpgroup_mma_wait(0, deps=[dk_tok, dsa])
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(s_idx), count=1)  # Q (and lse) done with
        m_blk += 1
        if m_blk == m_lo + n_m:  # the next query head of the group
            m_blk = m_lo
            h_in_group += 1

    _store_dkdv(dK, dV, dk, dv, k_row0, h_kv, nheads_kv, n_own, seqlen_k, softmax_scale, kv_layout, HEAD_DIM, ROWS,
                COALESCED_STORE, IO_DIM)


@gluon.jit
def _dq_half_mma(ds_cur, k_cur, COL0: gl.constexpr, COLS: gl.constexpr, zero):
    """One column range of the step's dQ block, dS K[:, COL0:COL0 + COLS], issued async (the column
    split's halves)."""
    return warpgroup_mma(ds_cur.permute((1, 0)), k_cur.slice(COL0, COLS, dim=1), zero, use_acc=False, is_async=True)


@gluon.jit
def _dq_hi_buf(q_cur, dq_smem, BLOCK_M: gl.constexpr, HALF: gl.constexpr, PD: gl.constexpr):
    """dQ's high half's staging in the step's Q slot (once dK, the slot's last reader, has retired;
    the writer releases the slot once its bulk copy has read the half): the slot as an fp32 [BLOCK_M,
    HALF] tile in the dQ buffer's layout, its first PD - HALF columns (the products over 192 columns:
    64)."""
    buf = q_cur._reinterpret(gl.float32, [BLOCK_M, HALF], dq_smem.layout)
    if PD - HALF != HALF:
        buf = buf.slice(0, PD - HALF, dim=1)
    return buf


@gluon.jit
def _hand_over(buf, x, full):
    """Store ``x`` into ``buf`` and announce it on ``full``: a proxy fence for the writer's bulk copy,
    a barrier over the partition's warps, one thread's arrive."""
    buf.store(x)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(full, count=1)


@gluon.jit
def _ws_consumer_dsplit(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar,
                        q_ready, q_empty, do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv,
                        n_start, m_lo, n_m, n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DO_STAGES: gl.constexpr,
                        IS_CAUSAL: gl.constexpr, STAGED_STORE: gl.constexpr = False, WINDOW: gl.constexpr = False,
                        win_left=0, win_right=0, SOFTCAP: gl.constexpr = False, softcap_a=0.0,
                        ALIBI: gl.constexpr = False, Alibi_h0=None, alibi_unit=0.0, IO_DIM: gl.constexpr = 0,
                        PROD_DIM: gl.constexpr = 0, DQ_HI_FIRST: gl.constexpr = False):
    """The two consumer warpgroups of the column-split kernel (``COL_SPLIT``, head dim 256;
    docs/hopper-backward.md, "The column split"): one 64-key block, every product split by its columns
    between the warpgroups (``_dq_layout``), so warpgroup c holds dK and dV columns [c d/2, (c + 1) d/2),
    and S^T, dP^T, P^T, dS^T for queries [32c, 32c + 32). P^T and dS^T go through shared memory
    (``p_smem``, ``ds_smem``); dQ in two column halves, the low one through the half-width dQ buffer,
    the high one through the step's Q slot (released by the writer). ``SOFTCAP``, ``ALIBI``: as
    ``_ws_consumer``. ``PROD_DIM``: the products over the tiles' first 192 of 256 columns (S^T and dP^T
    two chained products, dV and dK two accumulators each, dQ's high half 64 columns wide).
    ``DQ_HI_FIRST``: dK, then dQ's high half, then its low half, the high half handed to the writer
    first, so that the Q slot it is staged in goes back to the producer sooner; both stores follow the
    wait for the writer to have read the previous step's low half."""
    num_warps: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = k_smem.dtype
    HALF: gl.constexpr = HEAD_DIM // 2
    PD: gl.constexpr = _prod_dim(HEAD_DIM, PROD_DIM)
    SPLIT: gl.constexpr = PD != HEAD_DIM
    NG: gl.constexpr = 2 if SPLIT else 1  # commit groups of one S^T / dP^T / dV / dK product
    gl.static_assert(not SPLIT or STAGED_STORE, "the split accumulators are stored through the Q slots")
    off = seqlen_k - seqlen_q
    st_layout: gl.constexpr = _dq_layout(num_warps, BLOCK_M)    # S^T, dP^T: warpgroup c its 32 query columns
    kv_layout: gl.constexpr = _dq_layout(num_warps, HEAD_DIM)   # dK, dV: warpgroup c its d / 2 columns
    dq_layout: gl.constexpr = _dq_layout(num_warps, HALF)       # one dQ half: warpgroup c its d / 4 columns
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    keys_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    queries_1d = gl.arange(0, BLOCK_M, layout=col_layout)

    if SPLIT:  # columns 0:128 and 128:PD
        dk = gl.zeros([BLOCK_N, 128], gl.float32, layout=_dq_layout(num_warps, 128))
        dv = gl.zeros([BLOCK_N, 128], gl.float32, layout=_dq_layout(num_warps, 128))
        dk_hi = gl.zeros([BLOCK_N, PD - 128], gl.float32, layout=_dq_layout(num_warps, PD - 128))
        dv_hi = gl.zeros([BLOCK_N, PD - 128], gl.float32, layout=_dq_layout(num_warps, PD - 128))
    else:
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, HALF], gl.float32, layout=dq_layout)
    if SPLIT:  # dQ's high half: columns 128:PD
        dq_hi_zero = gl.zeros([BLOCK_M, PD - HALF], gl.float32, layout=_dq_layout(num_warps, PD - HALF))
    keys_inside = n_start + BLOCK_N <= seqlen_k
    mbarrier.wait(kv_bar, 0)

    # the query block by a counter and the in-loop zero from an asm move, as the key-split consumer
    # (docs/decisions/backward-ws-step.md)
    m_blk = m_lo
    h_in_group = 0  # the step's query head in the group (``ALIBI``'s slope)
    for t in range(n_iter):
        q_idx = t % STAGES
        do_idx = t % DO_STAGES
        m_start = m_blk * BLOCK_M
        alibi_a = 0.0
        if ALIBI:  # this step's head's slope, in the units of S^T (read early: a scalar load)
            alibi_a = gl.load(Alibi_h0 + h_in_group) * alibi_unit
        z = _opaque_zero()
        k_cur = k_smem.index(z)
        v_cur = v_smem.index(z)
        p_cur = p_smem.index(z)
        ds_cur = ds_smem.index(z)
        q_cur = q_smem.index(q_idx)
        do_cur = do_smem.index(do_idx)

        # S^T as soon as Q has landed, dP^T once dO has: each warpgroup its 32 query columns, over the
        # whole head dim
        mbarrier.wait(q_ready.index(q_idx), (t // STAGES) & 1)
        s_tok = _qk_mma(k_cur, q_cur, st_zero, PD)
        mbarrier.wait(do_ready.index(do_idx), (t // DO_STAGES) & 1)
        dp_tok = _qk_mma(v_cur, do_cur, st_zero, PD)
        lse_log2 = lse_smem.index(q_idx).load(col_layout)
        s = warpgroup_mma_wait(NG, deps=[s_tok])
        if SOFTCAP:
            s = _softcap(s, softcap_a)
        if SOFTCAP:  # the 16-bit P^T and, as ``p``, the fp32 P^T times the tanh's derivative (``_probs``)
            p16, p = _step_probs(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k,
                                 keys_1d, queries_1d, BLOCK_M, BLOCK_N, IS_CAUSAL, False, WINDOW, win_left,
                                 win_right, True, dtype, ALIBI, alibi_a)
        else:
            p = _step_probs(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                            queries_1d, BLOCK_M, BLOCK_N, IS_CAUSAL, False, WINDOW, win_left, win_right, False, None,
                            ALIBI, alibi_a)
            p16 = p.to(dtype)
        # P^T (16-bit) to shared memory, both halves before dV reads it. No barrier before the store
        # (WAR on p_smem): the previous step's dV retired in every warp before its dO barrier.
        p_cur.store(p16)
        fence_async_shared()
        gl.thread_barrier()
        # dV[:, own columns] += P^T dO, queued behind dP^T: it runs while dS^T is formed and stored
        if SPLIT:
            dv_tok, dvh_tok = _cols_mma(p_cur, do_cur, dv, dv_hi)
        else:
            dv_tok = warpgroup_mma(p_cur, do_cur, dv, is_async=True)
        delta = delta_smem.index(do_idx).load(col_layout)
        dp = warpgroup_mma_wait(NG, deps=[dp_tok])
        # dS^T from the fp32 P^T (registers; WAR on ds_smem: the previous step's readers retired in
        # every warp before its last barrier)
        ds_cur.store((p * (dp - delta[None, :])).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        if DQ_HI_FIRST:
            # dK, dQ's high half, dQ's low half: the high half (and with it the Q slot) is handed to the
            # writer while the low half runs, the low half while the next step starts
            if SPLIT:
                dk_tok, dkh_tok = _cols_mma(ds_cur, q_cur, dk, dk_hi)
            else:
                dk_tok = warpgroup_mma(ds_cur, q_cur, dk, is_async=True)
            dq_hi_tok = _dq_half_mma(ds_cur, k_cur, HALF, PD - HALF, dq_hi_zero if SPLIT else dq_zero)
            dq_lo_tok = _dq_half_mma(ds_cur, k_cur, 0, HALF, dq_zero)
            # releases as the groups retire (dV, dK, dQ high, dQ low), each arrive one thread's after a
            # barrier over the partition's 8 warps (the ws consumer's discipline)
            if SPLIT:
                dv, dv_hi = warpgroup_mma_wait(NG + 2, deps=[dv_tok, dvh_tok])
            else:
                dv = warpgroup_mma_wait(NG + 2, deps=[dv_tok])
            gl.thread_barrier()
            mbarrier.arrive(do_empty.index(do_idx), count=1)  # dO and D done with (and P^T)
            if SPLIT:
                dk, dk_hi = warpgroup_mma_wait(2, deps=[dk_tok, dkh_tok])
            else:
                dk = warpgroup_mma_wait(2, deps=[dk_tok])
            gl.thread_barrier()
            dq = warpgroup_mma_wait(1, deps=[dq_hi_tok])
            # handover t: after the writer has read step t - 1's low half, its last piece
            mbarrier.wait(dq_empty, (t + 1) & 1, pred=t > 0)
            _hand_over(_dq_hi_buf(q_cur, dq_smem, BLOCK_M, HALF, PD), dq, dq_hi_full)
            dq = warpgroup_mma_wait(0, deps=[dq_lo_tok])
            _hand_over(dq_smem, dq, dq_full)
        else:
            # dQ's low half, then dK, then dQ's high half: the low half is handed to the writer while
            # dK runs, the high half while the next step starts
            dq_lo_tok = _dq_half_mma(ds_cur, k_cur, 0, HALF, dq_zero)
            if SPLIT:
                dk_tok, dkh_tok = _cols_mma(ds_cur, q_cur, dk, dk_hi)
            else:
                dk_tok = warpgroup_mma(ds_cur, q_cur, dk, is_async=True)
            dq_hi_tok = _dq_half_mma(ds_cur, k_cur, HALF, PD - HALF, dq_hi_zero if SPLIT else dq_zero)
            # releases as the groups retire (dV, dQ low, dK, dQ high)
            if SPLIT:
                dv, dv_hi = warpgroup_mma_wait(NG + 2, deps=[dv_tok, dvh_tok])
            else:
                dv = warpgroup_mma_wait(NG + 2, deps=[dv_tok])
            gl.thread_barrier()
            mbarrier.arrive(do_empty.index(do_idx), count=1)  # dO and D done with (and P^T)
            dq = warpgroup_mma_wait(NG + 1, deps=[dq_lo_tok])
            # the buffer's handover t: after the writer has read both halves of step t - 1
            mbarrier.wait(dq_empty, (t + 1) & 1, pred=t > 0)
            _hand_over(dq_smem, dq, dq_full)
            if SPLIT:
                dk, dk_hi = warpgroup_mma_wait(1, deps=[dk_tok, dkh_tok])
            else:
                dk = warpgroup_mma_wait(1, deps=[dk_tok])
            gl.thread_barrier()  # dK retired in every warp: the Q slot is free for the high half
            dq = warpgroup_mma_wait(0, deps=[dq_hi_tok])
            _hand_over(_dq_hi_buf(q_cur, dq_smem, BLOCK_M, HALF, PD), dq, dq_hi_full)
        m_blk += 1
        if m_blk == m_lo + n_m:  # the next query head of the group
            m_blk = m_lo
            h_in_group += 1

    # the writer's reads of the last high halves in the Q ring done before the slots are rewritten:
    # slot i's last release (steps t < n_iter with t % STAGES == i; a parity wait is exact here, the
    # slot's release before that one preceded its last load)
    for i in gl.static_range(STAGES):
        uses = (n_iter - i + STAGES - 1) // STAGES
        mbarrier.wait(q_empty.index(i), (uses + 1) & 1, pred=uses > 0)
    if SPLIT:
        _store_dkdv_staged(dK, dV, dk, dv, q_smem, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, HEAD_DIM,
                           BLOCK_N, IO_DIM, dk_hi, dv_hi)
    elif STAGED_STORE:
        _store_dkdv_staged(dK, dV, dk, dv, q_smem, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, HEAD_DIM,
                           BLOCK_N, IO_DIM)
    else:
        _store_dkdv(dK, dV, dk, dv, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, kv_layout, HEAD_DIM,
                    BLOCK_N, IO_DIM=IO_DIM)


@gluon.jit
def _store_dkdv_staged(dK, dV, dk, dv, q_smem, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale,
                       HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IO_DIM: gl.constexpr = 0, dk_hi=None,
                       dv_hi=None):
    """``_store_dkdv`` in whole rows of 16-byte pieces, staged through the Q ring (free once the last
    step's dK product, its last reader, has retired in both warpgroups: the column-split kernel has no
    shared memory left for a conversion's scratch). dK into slot 0, dV into slot 1 (each a BLOCK_N x
    HEAD_DIM tile in the Q layout), read back row-wise and stored with the keys past seqlen_k masked.
    ``dk_hi`` / ``dv_hi`` (``_ws_consumer_dsplit``'s split products): ``dk`` / ``dv`` are the columns 0:128
    and these the next ones, staged side by side (the slot's columns past them hold stale Q, never
    stored: IO_DIM is at most their end)."""
    gl.static_assert(q_smem.shape[0] >= 2, "two Q slots: dK and dV")
    gl.static_assert(q_smem.shape[1] == BLOCK_N, "a Q slot holds one key block's tile")
    num_warps: gl.constexpr = gl.num_warps()
    row_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1],
                                                [1, 0])
    gl.thread_barrier()  # every warp's last dK product (which reads Q) retired before the slots are overwritten
    if dk_hi is None:
        q_smem.index(0).store((dk * softmax_scale).to(dK.dtype.element_ty))
        q_smem.index(1).store(dv.to(dV.dtype.element_ty))
    else:
        LO: gl.constexpr = dk.shape[1]
        HI: gl.constexpr = dk_hi.shape[1]
        gl.static_assert(0 < IO_DIM and IO_DIM <= LO + HI, "the stored columns lie in the two parts")
        q_smem.index(0).slice(0, LO, dim=1).store((dk * softmax_scale).to(dK.dtype.element_ty))
        q_smem.index(0).slice(LO, HI, dim=1).store((dk_hi * softmax_scale).to(dK.dtype.element_ty))
        q_smem.index(1).slice(0, LO, dim=1).store(dv.to(dV.dtype.element_ty))
        q_smem.index(1).slice(LO, HI, dim=1).store(dv_hi.to(dV.dtype.element_ty))
    gl.thread_barrier()
    _store_rows(dK, q_smem.index(0).load(row_layout), k_row0, h_kv, nheads_kv, n_start, seqlen_k, row_layout, HEAD_DIM,
                BLOCK_N, IO_DIM)
    _store_rows(dV, q_smem.index(1).load(row_layout), k_row0, h_kv, nheads_kv, n_start, seqlen_k, row_layout, HEAD_DIM,
                BLOCK_N, IO_DIM)


@gluon.jit
def _ws_consumers(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar, q_ready,
                  q_empty, do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo,
                  n_m, n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DO_STAGES: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, COL_SPLIT: gl.constexpr, COALESCED_STORE: gl.constexpr,
                  LSE_IN_ACC: gl.constexpr = False, WG_SPLIT: gl.constexpr = False, W: gl.constexpr = 0,
                  WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
                  softcap_a=0.0, ALIBI: gl.constexpr = False, Alibi_h0=None, alibi_unit=0.0,
                  IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, DQ_HI_FIRST: gl.constexpr = False):
    """The default partition: ``_ws_consumer`` (warpgroups split the keys) or, with ``COL_SPLIT``,
    ``_ws_consumer_dsplit`` (warpgroups split the head dim, P^T in ``p_smem``), on the same arguments
    (``LSE_IN_ACC``: the key split only). ``WG_SPLIT``: warpgroup ``W`` of the key split alone (the
    default partition and one worker), ``dq_hi_full`` its dS^T exchange barrier."""
    if COL_SPLIT:
        _ws_consumer_dsplit(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar,
                            q_ready, q_empty, do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv,
                            nheads_kv, n_start, m_lo, n_m, n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale,
                            HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DO_STAGES, IS_CAUSAL, COALESCED_STORE, WINDOW,
                            win_left, win_right, SOFTCAP, softcap_a, ALIBI, Alibi_h0, alibi_unit, IO_DIM, PROD_DIM,
                            DQ_HI_FIRST)
    else:
        gl.static_assert(PROD_DIM == 0, "the split products: the column-split consumers")
        _ws_consumer(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty,
                     do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo, n_m,
                     n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                     IS_CAUSAL, COALESCED_STORE, LSE_IN_ACC, WG_SPLIT, W, WINDOW, win_left, win_right, SOFTCAP,
                     softcap_a, ALIBI, Alibi_h0, alibi_unit, IO_DIM)


@gluon.jit
def hopper_bwd_ws_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dK, dV, Sem, Cu_q, Cu_k,
                         seqlen_q, seqlen_k, nheads, group, stat_stride, softmax_scale, qk_scale, win_left, win_right,
                         softcap_a, alibi_unit, stride_ab, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, DO_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                         DETERMINISTIC: gl.constexpr = False, COL_SPLIT: gl.constexpr = False,
                         COALESCED_STORE: gl.constexpr = False, DQ_FLAT: gl.constexpr = False,
                         LSE_IN_ACC: gl.constexpr = False, WG_SPLIT: gl.constexpr = False,
                         IS_VARLEN: gl.constexpr = False, WINDOW: gl.constexpr = False,
                         SOFTCAP: gl.constexpr = False, ALIBI: gl.constexpr = False, Alibi=None,
                         IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, dq_hi_desc=None,
                         DQ_HI_FIRST: gl.constexpr = False):
    """Variant "ws". Grid and dK / dV as ``hopper_bwd_dkdv_kernel``; num_warps = 8 (the consumers; 4
    with ``WG_SPLIT``); the producer and dQ-writer warps are added by ``warp_specialize``. lse_desc /
    delta_desc: 1-D over the host's padded (batch, nheads, stat_stride) fp32 lse rows (in the kernel's
    unit, -inf -> 0) and D, zero past seqlen_q. dq_desc: the zeroed fp32 accumulator, 2-D (rows, nheads
    * HEAD_DIM) or, with ``DQ_FLAT``, a (-1, 32) view of the flat one. Sem: with ``DETERMINISTIC``, the
    zeroed int32 counters. STAGES / DO_STAGES: the Q and dO rings' depths. ``COL_SPLIT`` (head dim
    256): BLOCK_N = 64, the consumers split the head dim (``_ws_consumer_dsplit``). ``IS_VARLEN``,
    ``WINDOW``, ``SOFTCAP`` (not with ``LSE_IN_ACC``), ``ALIBI``: the forms in docs/hopper-backward.md;
    ``Cu_q`` / ``Cu_k``, ``win_left`` / ``win_right``, ``softcap_a``, ``Alibi`` / ``stride_ab`` /
    ``alibi_unit`` their arguments. The other flags: the module's ``WS_*`` tables, through
    ``kernel_config``."""
    num_warps: gl.constexpr = gl.num_warps()
    if WG_SPLIT:  # (``WS_WG_PARTITIONS``) the default partition is warpgroup 0, a worker warpgroup 1
        gl.static_assert(num_warps == 4 and DQ_FLAT and not COL_SPLIT, "a warpgroup a partition: the flat key split")
    else:
        gl.static_assert(num_warps == 8, "two consumer warpgroups")
    if COL_SPLIT:
        gl.static_assert(BLOCK_N == 64, "column split: one 64-key block, the warpgroups split the head dim")
        gl.static_assert(not LSE_IN_ACC, "lse in S^T's accumulator: the key split only")
    else:
        gl.static_assert(BLOCK_N == 128, "two consumer warpgroups of 64 key rows")
        gl.static_assert(DO_STAGES == STAGES, "one slot index for both rings")
    gl.static_assert(not (SOFTCAP and LSE_IN_ACC), "a softcap needs the raw scores in S^T's accumulator")
    gl.static_assert((PROD_DIM == 0) == (dq_hi_desc is None), "the split products: dQ's high half by dq_hi_desc")
    # columns of one dQ handover (the dQ descriptor's block): the column split hands dQ over in halves
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if COL_SPLIT else HEAD_DIM
    if COL_SPLIT:
        gl.static_assert(BLOCK_M == 64, "the dQ halves' M: one 64-row wgmma tile")
    else:
        gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "dQ: one 64-row tile, or a 64-row tile a warpgroup")
    gl.static_assert(STAGES >= 2, "a load in flight while a step computes")
    if COL_SPLIT:
        gl.static_assert(HEAD_DIM * q_desc.dtype.primitive_bitwidth == DQ_COLS * 32,
                         "a Q slot holds one fp32 dQ half")
    gl.static_assert(DO_STAGES >= 1 and DO_STAGES <= STAGES, "dO ring no deeper than Q's")
    dtype: gl.constexpr = q_desc.dtype

    nheads_kv = nheads // group
    # deterministic + causal: the key blocks launch in reverse, the order their dQ additions take
    b, h_kv, n_start = _key_block(nheads_kv, BLOCK_N, DETERMINISTIC and IS_CAUSAL)
    # query blocks per (batch, head) in the padded stat rows, the flat dQ accumulator and Sem
    n_m_total = stat_stride // BLOCK_M
    if IS_VARLEN:  # this sequence's first rows and lengths (seqlen_q / seqlen_k from here on are its own)
        q_row0 = gl.load(Cu_q + b)
        seqlen_q = gl.load(Cu_q + b + 1) - q_row0
        k_row0 = gl.load(Cu_k + b)
        seqlen_k = gl.load(Cu_k + b + 1) - k_row0
        # the end of the rows the sequences own (the producer zeroes what a tile reads past it)
        q_owned = gl.load(Cu_q + gl.num_programs(1) // nheads_kv)
        k_owned = gl.load(Cu_k + gl.num_programs(1) // nheads_kv)
    else:
        q_row0 = b * seqlen_q
        k_row0 = b * seqlen_k
        q_owned = 0  # unused
        k_owned = 0
    n_m_seq = gl.cdiv(seqlen_q, BLOCK_M)  # this sequence's query blocks
    m_lo = 0
    if IS_CAUSAL:
        m_lo = gl.minimum(gl.maximum(n_start - (seqlen_k - seqlen_q), 0) // BLOCK_M, n_m_seq)
    n_m = n_m_seq - m_lo
    if WINDOW:  # the query blocks this key block's band reaches: [m_lo, m_hi)
        gl.static_assert(not IS_CAUSAL, "a causal mask is the window (-1, 0): IS_CAUSAL's own path")
        m_lo = gl.minimum(gl.maximum(n_start - (seqlen_k - seqlen_q) - win_right, 0) // BLOCK_M, n_m_seq)
        last_row = n_start + BLOCK_N - 1 - (seqlen_k - seqlen_q) + win_left  # the last query that sees a key here
        m_hi = gl.minimum(gl.cdiv(gl.maximum(last_row + 1, 0), BLOCK_M), n_m_seq)
        n_m = gl.maximum(m_hi - m_lo, 0)
    if IS_VARLEN:  # a key block past its sequence's end (the grid covers the longest): no step, no store
        n_m = gl.where(n_start < seqlen_k, n_m, 0)
    n_iter = group * n_m
    h0 = h_kv * group
    # the slopes of this program's group of query heads (read only under ``ALIBI``; the launcher passes
    # an empty tensor without: a None handed on to the partitions does not compile at run time)
    Alibi_h0 = Alibi + b * stride_ab + h0

    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], _tile_layout(k_desc.layout))
    v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], _tile_layout(v_desc.layout))
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], _tile_layout(q_desc.layout))
    do_smem = gl.allocate_shared_memory(dtype, [DO_STAGES, BLOCK_M, HEAD_DIM], _tile_layout(do_desc.layout))
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [DO_STAGES, BLOCK_M], delta_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ds_layout)
    # one dQ buffer (FA3 has one): handed over once a step (column split: once a half), read by the
    # bulk copy long before the next handover
    if WG_SPLIT:  # each warpgroup's dQ half in its own buffer: the flat tile's two halves (its top bit)
        DQ_M: gl.constexpr = BLOCK_M // 2 if BLOCK_M == 128 else BLOCK_M
        DQ_N: gl.constexpr = HEAD_DIM // 2 if BLOCK_M == 64 else HEAD_DIM
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_M, DQ_N], _dq_flat_layout(4, DQ_M, DQ_N))
        dq_smem1 = gl.allocate_shared_memory(gl.float32, [DQ_M, DQ_N], _dq_flat_layout(4, DQ_M, DQ_N))
    elif DQ_FLAT:  # in the accumulator's order (``WS_DQ_FLAT``); dq_desc: the dense 2-D view's [rows, 32] box
        gl.static_assert(not COL_SPLIT, "the flat dQ tile: key-split form only")
        dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, DQ_COLS], _dq_flat_layout(num_warps, BLOCK_M,
                                                                                            HEAD_DIM))
        dq_smem1 = dq_smem  # unused
    else:
        dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, DQ_COLS], dq_desc.layout)
        dq_smem1 = dq_smem  # unused
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    do_ready = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], bar_layout)
    do_empty = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], bar_layout)
    dq_full = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    dq_empty = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    if IS_VARLEN:  # the producer's own barrier for the tiles it zeroes past the owned rows
        tail_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        mbarrier.init(tail_bar, count=1)
    else:
        tail_bar = kv_bar  # unused
    # every barrier completes on one arrive: a TMA's expect-tx (ready, kv), the consumer partition's
    # single thread after a barrier over its 8 warps (empty, dq_full), the writer warp (dq_empty);
    # ``WG_SPLIT``: the consumers' on two, one a warpgroup partition (CONSUMERS)
    CONSUMERS: gl.constexpr = 2 if WG_SPLIT else 1
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(dq_full, count=CONSUMERS)
    mbarrier.init(dq_empty, count=1)
    if COL_SPLIT:  # the high half's handover (dq_full: the low half's)
        dq_hi_full = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        mbarrier.init(dq_hi_full, count=1)
    elif WG_SPLIT:  # the key split's dS^T exchange between the two consumer partitions (``ds_full``)
        dq_hi_full = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        mbarrier.init(dq_hi_full, count=2)
    else:
        dq_hi_full = dq_full  # unused
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=CONSUMERS)
        if i < DO_STAGES:
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(do_empty.index(i), count=CONSUMERS)
    fence_async_shared()
    if COL_SPLIT:
        # P^T, which passes between the warpgroups as dS^T does (its own allocation: one shared with dS^T
        # made Triton order the dS^T store after the dV product's issue with one more barrier a step)
        p_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ds_layout)
    else:
        p_smem = ds_smem  # unused by ``_ws_consumer``

    # Registers (FA3's split for two MMA warpgroups): producer and writer warps 24 each (they share
    # one padded warpgroup: 12 warps, 384 threads), the default (consumer) partition gets the rest,
    # (65536 - 24 * 128) / 256 -> 240, what setmaxnreg shows in the PTX (the compile check asserts it).
    # ``WG_SPLIT``: warpgroup 1 a worker partition of its own at the consumers' 240 (the default
    # partition, warpgroup 0, gets the rest: the same split of the registers)
    gl.warp_specialize([
        (_ws_consumers, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem,
                         dq_smem1 if w else dq_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, dq_full, dq_empty,
                         dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo, n_m, n_iter, seqlen_q, seqlen_k,
                         softmax_scale, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DO_STAGES, IS_CAUSAL, COL_SPLIT,
                         COALESCED_STORE, LSE_IN_ACC, WG_SPLIT, w, WINDOW, win_left, win_right, SOFTCAP, softcap_a,
                         ALIBI, Alibi_h0, alibi_unit, IO_DIM, PROD_DIM, DQ_HI_FIRST))
        if w < CONSUMERS else
        (_ws_producer, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                        lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, tail_bar, b, h0,
                        k_row0 + n_start, h_kv * _io_dim(HEAD_DIM, IO_DIM), m_lo, n_m, n_iter, q_row0, nheads,
                        stat_stride, seqlen_q, seqlen_k, n_start, q_owned, k_owned, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                        DO_STAGES, IS_VARLEN, IO_DIM))
        if w == CONSUMERS else
        (_ws_dq_writer, (dq_desc, dq_smem, dq_full, dq_empty, q_smem, q_empty, dq_hi_full, Sem, b, h0, m_lo, n_m,
                         n_iter, q_row0, seqlen_q, seqlen_k, nheads, n_m_total, n_start // BLOCK_N, HEAD_DIM, BLOCK_M, BLOCK_N,
                         IS_CAUSAL, DETERMINISTIC, DQ_COLS, STAGES, DQ_FLAT, dq_smem1, WG_SPLIT, WINDOW, win_left,
                         dq_hi_desc, DQ_HI_FIRST))
        for w in (0, 1, 2, 3)[:CONSUMERS + 2]
    ], [4, 1, 1] if WG_SPLIT else [1, 1],
        [WS_CONSUMER_REGS, WS_WORKER_REGS, WS_WORKER_REGS] if WG_SPLIT else [WS_WORKER_REGS, WS_WORKER_REGS])


def kernel_config(d: int, variant: str = "base", softcap: bool = False, alibi: bool = False) -> dict:
    """Launch configuration of the backward kernel of ``variant`` (``BWD_VARIANTS``) at head dim ``d``
    (the launcher and tools/compile_check_hopper_bwd.py share it): ``kernel`` the jit function,
    ``num_warps`` the kernel's warps (the consumers' for "ws": the producer and writer warps come on
    top, from ``warp_specialize``; with ``WS_WG_PARTITIONS`` warpgroup 0's 4, warpgroup 1 a worker),
    tiles, ``stages`` (Q / dO buffers; "ws": the Q ring's, the dO ring's in the constexprs),
    ``dq_cols`` ("ws": the columns of one dQ handover, the dQ descriptor's block) and the constexprs.
    "ws" at d = 256 is its column-split form (``COL_SPLIT``); ``softcap`` ("ws"): the ``SOFTCAP`` form
    (``WS_SCORE_MOD_BLOCK_M``'s rows a step; lse not in S^T's accumulator, where the tanh needs the raw
    scores); ``alibi`` ("ws"): ``WS_SCORE_MOD_BLOCK_M``'s rows a step (the kernel's ``ALIBI`` is the
    launcher's, as its other flags)."""
    if variant in BWD_VARIANTS and d not in BWD_VARIANT_HEADDIMS[variant]:
        raise ValueError(f"the Hopper backward's {variant} variant covers head dims "
                         f"{', '.join(map(str, BWD_VARIANT_HEADDIMS[variant]))}, not {d}")
    if variant == "base":
        return dict(kernel=hopper_bwd_dkdv_kernel, block_m=BWD_BLOCK_M, block_n=BWD_BLOCK_N, num_warps=BWD_NUM_WARPS,
                    stages=2, constexprs=dict(HEAD_DIM=d, BLOCK_M=BWD_BLOCK_M, BLOCK_N=BWD_BLOCK_N))
    if variant == "ws":
        split = d in WS_COL_SPLIT_HEADDIMS or (softcap and d in WS_SOFTCAP_COL_SPLIT_HEADDIMS)
        block_n = WS_COL_SPLIT_BLOCK_N if split else BWD_BLOCK_N
        stages, do_stages = WS_STAGES[d]
        block_m = WS_SCORE_MOD_BLOCK_M.get(d, WS_BLOCK_M[d]) if softcap or alibi else WS_BLOCK_M[d]
        flat = bool(WS_DQ_FLAT.get(d, False)) and not split
        wg_split = bool(WS_WG_PARTITIONS.get(d, False)) and flat
        # the kernel's warps: the consumers' 8, or warpgroup 0's 4 with a partition a warpgroup (warpgroup 1
        # is a worker then); the flat tile's box: halves with a partition a warpgroup
        return dict(kernel=hopper_bwd_ws_kernel, block_m=block_m, block_n=block_n,
                    num_warps=BWD_NUM_WARPS // 2 if wg_split else BWD_NUM_WARPS,
                    stages=stages, worker_regs=WS_WORKER_REGS.value, dq_cols=d // 2 if split else d,
                    dq_flat=flat, dq_block=[block_m * d // (64 if wg_split else 32), 32] if flat
                    else [block_m, d // 2 if split else d],
                    constexprs=dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
                                    DO_STAGES=do_stages, COL_SPLIT=split,
                                    COALESCED_STORE=WS_COALESCED_STORE, DQ_FLAT=flat,
                                    LSE_IN_ACC=bool(WS_LSE_IN_ACC.get(d, False)) and not split and not softcap,
                                    WG_SPLIT=wg_split, SOFTCAP=bool(softcap)))
    raise ValueError(f"unknown backward variant {variant!r}; one of {BWD_VARIANTS}")


def ws_layouts(d: int, dtype, softcap: bool = False, alibi: bool = False) -> dict:
    """Shared-memory layouts of the "ws" kernel's descriptors (Gluon dtype ``dtype``) at head dim
    ``d``, for ``kernel_config(d, "ws", softcap, alibi)``'s blocks: Q / dO and K / V as the base kernel's, the 1-D
    lse / D rows unswizzled, the fp32 dQ tile (``dq_cols`` wide) swizzled by ``WS_DQ_SWIZZLE`` (the
    launcher and the compile check share them)."""
    cfg = kernel_config(d, "ws", softcap, alibi)
    bm, bn = cfg["block_m"], cfg["block_n"]
    return dict(q=gl.NVMMASharedLayout.get_default_for([bm, d], dtype),
                kv=gl.NVMMASharedLayout.get_default_for([bn, d], dtype),
                stat=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1),
                dq=gl.NVMMASharedLayout(swizzle_byte_width=0 if cfg["dq_flat"] else WS_DQ_SWIZZLE[d],
                                        element_bitwidth=32, rank=2))


def hopper_backward(dout, q, k, v, out, lse, softmax_scale, causal, variant="base", deterministic=False,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, window=(-1, -1),
                    softcap=0.0, alibi_slopes=None):
    """(dq, dk, dv) for (batch, seqlen, heads, d) bf16/fp16 q, k, v (GQA allowed; contiguous or views of
    a packed tensor, ``dispatch.tma_rows_view``, else copied), d in (64, 128) (and 256 with variant
    "ws"), causal (bottom-right) or not; ``lse`` natural-log (batch, nheads, seqlen_q) fp32, as both
    forwards return it. ``variant``: one of ``BWD_VARIANTS``, the same results up to the order of the
    fp32 dQ additions, which are not bitwise reproducible except with ``deterministic=True`` ("ws").
    "ws" only: varlen (``cu_seqlens_q`` / ``cu_seqlens_k`` and the longest lengths; packed tensors, lse
    (nheads, total_q); rows no sequence owns get zero gradients), ``window`` (flash-attn's (left, right),
    bottom-right aligned; (-1, 0) is ``causal=True``), ``softcap`` > 0 (the forward's capped scores) and
    ``alibi_slopes`` (fp32 (nheads,) or (batch, nheads); softmax_scale nonzero without a softcap). No
    dropout. A head dim the kernels lack (``ioattn.hopper.PADDED_RANGE``) runs at the next one, in place
    for "ws" with d a multiple of 8 (``hopper.padded_in_place``), else on zero-padded copies."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dp = _host.padded_headdim(q.shape[-1])
    if dp:
        window = (-1, 0) if causal else tuple(int(w) for w in window)
        refusal = _host.padded_refusal(q.shape[-1], cu_seqlens_q is not None, window, softcap, alibi_slopes)
        if refusal:
            raise ValueError(refusal)
        if variant != "ws" or not _host.padded_in_place(q.shape[-1]):
            if _host.call_forms(cu_seqlens_q is not None, window, softcap, alibi_slopes):
                raise ValueError(f"head dim {q.shape[-1]} with packed sequences, a window, a softcap or ALiBi: "
                                 f"the ws variant in place only (here variant {variant!r})")
            grads = hopper_backward(*(_host.pad_head(t, dp) for t in (dout, q, k, v, out)), lse, softmax_scale,
                                    causal, variant=variant, deterministic=deterministic)
            return tuple(g[..., :q.shape[-1]].contiguous() for g in grads)
    varlen = cu_seqlens_q is not None
    nheads, io_dim = q.shape[-2], q.shape[-1]
    d = dp or io_dim  # the kernel's head dim; a padded call's tensors keep io_dim
    nheads_kv = k.shape[-2]
    if varlen:
        if variant != "ws":
            raise ValueError(f"varlen needs variant \"ws\", got {variant!r}")
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, int(max_seqlen_q), int(max_seqlen_k)
        assert q.dim() == 3 and cu_seqlens_k is not None and cu_seqlens_k.numel() == batch + 1
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        assert lse.shape == (nheads, q.shape[0]) and lse.stride(1) == 1 and lse.dtype == torch.float32
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        assert lse.shape == (batch, nheads, seqlen_q) and lse.stride(2) == 1 and lse.dtype == torch.float32
        lse_strides = (lse.stride(0), lse.stride(1))
    assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype and v.dtype == q.dtype
    assert nheads % nheads_kv == 0
    window = tuple(int(w) for w in window)
    if window == (-1, 0) and not causal:
        raise ValueError("window (-1, 0) is the causal mask: pass causal=True")
    has_window = window != (-1, -1) and not causal
    if causal and window not in ((-1, -1), (-1, 0)):
        raise ValueError(f"causal=True with window {window}: pass the window alone (its right side 0)")
    if has_window and variant != "ws":
        raise ValueError(f"a sliding window needs variant \"ws\", got {variant!r}")
    if not softcap >= 0:
        raise ValueError(f"softcap must be >= 0 (0: none), got {softcap}")
    if softcap > 0 and variant != "ws":
        raise ValueError(f"a softcap needs variant \"ws\", got {variant!r}")
    has_alibi = alibi_slopes is not None
    if has_alibi:
        if variant != "ws":
            raise ValueError(f"ALiBi needs variant \"ws\", got {variant!r}")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)) or alibi_slopes.dtype != torch.float32 \
                or alibi_slopes.stride(-1) != 1:
            raise ValueError(f"alibi_slopes must be fp32 of shape ({nheads},) or ({batch}, {nheads}) with unit "
                             f"head stride, got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
        if softcap <= 0 and softmax_scale == 0:
            raise ValueError("ALiBi needs softmax_scale != 0 here (the bias joins the scores in their units)")
        if _host.alibi_length_refusal(q, k, varlen, _host.bwd_alibi_form(d, softcap)):
            raise ValueError(_host.alibi_length_refusal(q, k, varlen, _host.bwd_alibi_form(d, softcap)))
    cfg = kernel_config(d, variant, softcap > 0, alibi_slopes is not None)
    if deterministic and variant != "ws":
        raise ValueError(f"deterministic=True needs variant \"ws\" (the ordered dQ mode), got {variant!r}")
    # the descriptors read 2-D (rows, heads * d) views: a packed qkv's views as they are, other layouts
    # (and dO with zero strides, as autograd passes for a sum) copied
    q, k, v, dout = (t if tma_rows_view(t) is not None else t.contiguous() for t in (q, k, v, dout))
    # varlen: zeros first, the kernels write only the rows some sequence owns
    grad_like = torch.zeros_like if varlen else torch.empty_like
    dk = grad_like(k, memory_format=torch.contiguous_format)
    dv = grad_like(v, memory_format=torch.contiguous_format)
    if q.numel() == 0 or k.numel() == 0 or seqlen_q == 0 or seqlen_k == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    # D = rowsum(dO * O) fp32 by the portable backward's preprocess kernel (one read of O and dO; the
    # torch expression it replaces made fp32 copies of both, ~1 GB of traffic at d=128 x 16k tokens x
    # 16 heads), written straight into the layout the variant reads: (batch, nheads, seqlen_q) for
    # "base"; for "ws" each head's row padded with zeros to a whole number of query blocks, so that
    # every 1-D TMA row tile stays inside its head and rows past seqlen_q read 0
    bm = cfg["block_m"]
    stat_stride = seqlen_q if variant == "base" else triton_cdiv(seqlen_q, bm) * bm
    out = out.contiguous()
    flat = variant == "ws" and cfg["dq_flat"]
    # (batch, sequence, head) strides of O and dO for the preprocess kernel (varlen: rows from cu_seqlens_q)
    o_strides = (0, out.stride(0), out.stride(1)) if varlen else (out.stride(0), out.stride(1), out.stride(2))
    do_strides = (0, dout.stride(0), dout.stride(1)) if varlen else (dout.stride(0), dout.stride(1), dout.stride(2))
    cu_q = cu_seqlens_q if varlen else q.new_empty(0, dtype=torch.int32)
    cu_k = cu_seqlens_k if varlen else q.new_empty(0, dtype=torch.int32)
    # "ws": lse in log2 units (-inf rows, which saw no key, -> 0: the base kernel's guard), padded as D;
    # with ``LSE_IN_ACC`` lse / softmax_scale instead, where S^T's accumulator starts (the same
    # exponent once the scores are scaled by softmax_scale * log2 e)
    consts = dict(cfg["constexprs"])
    if variant == "ws":
        consts["LSE_IN_ACC"] = consts["LSE_IN_ACC"] and softmax_scale > 0
    lse_unit = 1.0 / softmax_scale if consts.get("LSE_IN_ACC") else constants.LOG2E
    if variant == "ws":
        # One launch writes D, the lse rows and the zeroed flat dQ accumulator, in the padded layout the
        # kernel reads (FA3's preprocess does the same three jobs), in place of three fills and four
        # small element-wise kernels for the lse rows, whose fixed cost weighed at short lengths
        # (docs/decisions/backward-dq-path.md).
        delta = torch.empty(batch, nheads, stat_stride, device=q.device, dtype=torch.float32)
        lse2 = torch.empty_like(delta)
        if flat:  # at the kernel's head dim (a padded call's extra columns: zeros, never read back)
            dq_accum = torch.empty(batch * nheads * stat_stride * d, device=q.device, dtype=torch.float32)
        else:  # (rows, nheads, d), as dQ at the kernel's head dim
            dq_accum = torch.zeros(*q.shape[:-1], d, device=q.device, dtype=torch.float32)
        attn_bwd_preprocess_kernel[(stat_stride // 64 * batch * nheads,)](
            out, dout, delta, cu_q, *o_strides, *do_strides, delta.stride(0), delta.stride(1), nheads, seqlen_q,
            HEAD_DIM=io_dim, BLOCK_D=d, BLOCK_M=64, IS_VARLEN=varlen, Lse=lse, LseOut=lse2,
            DQacc=dq_accum if flat else delta, stride_slb=lse_strides[0], stride_slh=lse_strides[1],
            stat_rows=stat_stride, lse_unit=lse_unit, PADDED=True, ZERO_DQ=flat, DQ_DIM=d)
    else:  # "base": (batch, nheads, seqlen_q), as it was measured
        delta = torch.zeros(batch, nheads, stat_stride, device=q.device, dtype=torch.float32)
        attn_bwd_preprocess_kernel[(triton_cdiv(seqlen_q, 64) * batch * nheads,)](
            out, dout, delta, q.new_empty(0, dtype=torch.int32), out.stride(0), out.stride(1), out.stride(2),
            dout.stride(0), dout.stride(1), dout.stride(2), delta.stride(0), delta.stride(1), nheads, seqlen_q,
            HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64, IS_VARLEN=False)
        dq_accum = torch.zeros(batch, seqlen_q, nheads, d, device=q.device, dtype=torch.float32)

    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    bn = cfg["block_n"]
    grid = (triton_cdiv(seqlen_k, bn), batch * nheads_kv)
    if variant == "base":
        q_layout = gl.NVMMASharedLayout.get_default_for([bm, d], gdt)
        kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
    else:
        lay = ws_layouts(d, gdt, softcap > 0, has_alibi)
        q_layout, kv_layout = lay["q"], lay["kv"]
    if dp:  # the rows views in [.., d] boxes zero-filled past io_dim (the forward's)
        q_desc, do_desc = (_host.padded_rows_desc(t, bm, d, gdt) for t in (q, dout))
        k_desc, v_desc = (_host.padded_rows_desc(t, bn, d, gdt) for t in (k, v))
    else:
        q_desc = TensorDescriptor.from_tensor(tma_rows_view(q), [bm, d], q_layout)
        do_desc = TensorDescriptor.from_tensor(tma_rows_view(dout), [bm, d], q_layout)
        k_desc = TensorDescriptor.from_tensor(tma_rows_view(k), [bn, d], kv_layout)
        v_desc = TensorDescriptor.from_tensor(tma_rows_view(v), [bn, d], kv_layout)
    if variant == "base":
        hopper_bwd_dkdv_kernel[grid](q_desc, k_desc, v_desc, do_desc, lse, delta, dq_accum, dk, dv,
                                     seqlen_q, seqlen_k, nheads, nheads // nheads_kv,
                                     lse.stride(0), lse.stride(1), delta.stride(0), delta.stride(1),
                                     float(softmax_scale), float(softmax_scale) * constants.LOG2E,
                                     IS_CAUSAL=bool(causal), num_warps=cfg["num_warps"], **cfg["constexprs"])
    else:
        lse_desc = TensorDescriptor.from_tensor(lse2.view(-1), [bm], lay["stat"])
        delta_desc = TensorDescriptor.from_tensor(delta.view(-1), [bm], lay["stat"])
        dq_2d = dq_accum.view(-1, 32) if flat else dq_accum.view(-1, nheads * d)  # at the kernel's d
        dq_desc = TensorDescriptor.from_tensor(dq_2d, cfg["dq_block"], lay["dq"])
        # the products over 192 columns (hopper.bwd_split_cols): dQ's high half 64 columns wide
        prod_dim = _host.bwd_split_cols_for(d, io_dim if dp else 0, consts["COL_SPLIT"])
        dq_hi_desc = TensorDescriptor.from_tensor(dq_2d, [bm, prod_dim - d // 2], lay["dq"]) if prod_dim else None
        # a window's unbounded side: a bound past every row of either length (the kernel's arithmetic
        # adds it to row indices, so no larger than int32 needs)
        unbounded = seqlen_q + seqlen_k + 1
        # one counter per (batch, head, query block) orders the dQ additions (deterministic only)
        sem = torch.zeros(batch * nheads * triton_cdiv(seqlen_q, bm) if deterministic else 1, device=q.device,
                          dtype=torch.int32)
        hopper_bwd_ws_kernel[grid](q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk, dv, sem,
                                   cu_q, cu_k, seqlen_q, seqlen_k, nheads, nheads // nheads_kv, stat_stride,
                                   # with a softcap the scores reach the exponentials as tanh(s * softcap_a): the
                                   # cap times log2 e scales them (the Gluon forward's convention)
                                   float(softmax_scale), (softcap if softcap > 0 else softmax_scale) * constants.LOG2E,
                                   *((w if w >= 0 else unbounded for w in window) if has_window else (0, 0)),
                                   softmax_scale / softcap if softcap > 0 else 0.0,
                                   # ALiBi: the slope to the scores' units (as the forward's)
                                   -1.0 / (softcap if softcap > 0 else softmax_scale) if has_alibi else 0.0,
                                   alibi_slopes.stride(0) if has_alibi and alibi_slopes.dim() == 2 else 0,
                                   ALIBI=_host.bwd_alibi_form(d, softcap) if has_alibi else 0,
                                   Alibi=alibi_slopes if has_alibi else q.new_empty(0, dtype=torch.float32),
                                   IS_CAUSAL=bool(causal), DETERMINISTIC=bool(deterministic), IS_VARLEN=varlen,
                                   WINDOW=has_window, IO_DIM=io_dim if dp else 0,
                                   PROD_DIM=prod_dim, dq_hi_desc=dq_hi_desc,
                                   DQ_HI_FIRST=dq_hi_first(d, consts["COL_SPLIT"], prod_dim),
                                   num_warps=cfg["num_warps"], **consts)
    if flat:
        return dq_from_flat(dq_accum, q, bm, softmax_scale, cu_q if varlen else None, stat_stride // bm, d), dk, dv
    # one pass: scale and cast into dQ (``(dq_accum * scale).to(dtype)`` made an fp32 copy first)
    dq = torch.mul(dq_accum[..., :io_dim], softmax_scale,
                   out=torch.empty_like(q, memory_format=torch.contiguous_format))
    return dq, dk, dv


def dq_from_flat(dq_accum, q, block_m, scale, cu_seqlens_q=None, n_m=None, acc_dim=None):
    """dQ (q's shape and dtype) = scale * the flat accumulator (``WS_DQ_FLAT``: per (batch, head,
    query block) a [block_m, d] block in ``dq_flat_bases`` order), in one pass of the portable
    ``dq_from_blocks_kernel``: the order is a permutation of the coordinates' bits, so an element's
    offset is a row part plus a column part (two small tables); a torch copy through a view of 2 x ...
    x 2 dimensions costs a fixed share at short lengths (docs/decisions/backward-dq-path.md).
    Varlen (``cu_seqlens_q``; q packed (total_q, nheads, d)): ``n_m`` blocks per (batch, head), block m
    of sequence b to rows cu_seqlens_q[b] + m * block_m on; rows no sequence owns are 0. ``acc_dim``:
    the accumulator's head dim where it is q's zero-padded (a padded call in place), its first q.shape[-1]
    columns stored."""
    varlen = cu_seqlens_q is not None
    nheads, d = q.shape[-2], acc_dim or q.shape[-1]
    if varlen:
        batch, seqlen_q = cu_seqlens_q.numel() - 1, 0
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
        strides = (0, dq.stride(0), dq.stride(1))
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        n_m = triton_cdiv(seqlen_q, block_m)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        strides = (dq.stride(0), dq.stride(1), dq.stride(2))
    row_off, col_off = _flat_offset_tables(block_m, d, str(q.device))
    dq_from_blocks_kernel[(batch * nheads * n_m,)](dq_accum, row_off, col_off, dq, seqlen_q, nheads, n_m, *strides,
                                                  float(scale), cu_seqlens_q if varlen else row_off,
                                                  BLOCK_M=block_m, HEAD_DIM=d, IS_VARLEN=varlen,
                                                  D_OUT=q.shape[-1] if q.shape[-1] != d else 0, num_warps=4)
    return dq


@functools.lru_cache(maxsize=None)
def _flat_offset_tables(block_m, d, device):
    """int32 (row part, column part) of the flat offsets of a [block_m, d] block, per device."""
    row_off, col_off = [0] * block_m, [0] * d
    for bit, (r, c) in enumerate(dq_flat_bases(BWD_NUM_WARPS, block_m, d)):
        for i in range(block_m):
            row_off[i] += (1 << bit) if r and i & r else 0
        for j in range(d):
            col_off[j] += (1 << bit) if c and j & c else 0
    return (torch.tensor(row_off, dtype=torch.int32, device=device),
            torch.tensor(col_off, dtype=torch.int32, device=device))


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
