"""Pieces the Gluon Hopper forward and backward share: their constants, the TMA row loads (with the
head-padded descriptors' zero fill), the QK^T product and the score modifications' arithmetic."""
import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma, warpgroup_mma

from ioattn.kernels import constants
from ioattn.kernels import hopper_flags as _flags
from ioattn.reference import fp8


@gluon.constexpr_function
def _io_dim(head_dim, io_dim):
    """The tensors' head dim: ``IO_DIM`` where the kernel computes at a larger ``HEAD_DIM`` (the
    columns past it zero-filled by TMA, ``_load_rows``), else ``HEAD_DIM``."""
    return io_dim if io_dim else head_dim



@gluon.constexpr_function
def _tile_layout(layout):
    """The shared layout of the [rows, HEAD_DIM] tiles a descriptor with ``layout`` fills: its own, or
    for a head-padded descriptor (rank 3, ``_load_rows``) the same swizzle at rank 2."""
    if layout.rank == 2:
        return layout
    return gl.NVMMASharedLayout(swizzle_byte_width=layout.swizzle_byte_width,
                                element_bitwidth=layout.element_bitwidth, rank=2)



@gluon.jit
def _load_rows(desc, row, col, bar, dst, c0=0):
    """TMA copy of the [rows, HEAD_DIM] tile at (``row``, ``col``) of the (rows, nheads * d) view into
    ``dst``, completing on ``bar`` (``col``: a head's first column, head * d). A 3-D ``desc``
    (``ioattn.plan.gluon_fwd.padded_rows_desc``: the tensors' head dim d below the kernel's HEAD_DIM, a
    multiple of 8) reads the same view with its column split into 8-column groups and an offset
    bounded by d, so the columns past d land as zeros (TMA's fill of a box past the bounds): the
    kernel computes at HEAD_DIM on zero-padded heads without a padded copy. ``c0``: the box's first
    column within the head (the K / V tiles' columns 128: in buffers of their own, ``_split_ring``)."""
    if len(desc.block_type.shape) == 3:
        tma.async_copy_global_to_shared(desc, [col // 8, row, c0], bar,
                                        dst.reshape([1, dst.shape[0], dst.shape[1]]))
    else:
        tma.async_copy_global_to_shared(desc, [row, col + c0], bar, dst)



@gluon.jit
def _zero_v_tail(v_tile, valid, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Rows >= ``valid`` of a V tile in shared memory set to 0: keys past the sequence's end, which
    the TMA box read from the next sequence's (or batch element's) rows. Their probabilities are 0,
    but 0 x NaN is NaN in the P V product, so a NaN or inf there would reach this sequence's output.
    By the producer warp of the training kernels (a consumer warpgroup has no registers to spare at
    the last tile: the three-warpgroup kernel spilled), or by every warp of the MLA decode program; the
    rows the end falls in are read, masked and written back. Then a proxy fence (the wgmma reads
    through the async proxy; the arrive that follows orders them after it) and a barrier."""
    # [8, 64 x warps] pieces: 8 rows (the 128-byte swizzle's atom) x one swizzle span of 64 columns a
    # warp (the tile is stored as HEAD_DIM / 64 such column groups), 16 elements a thread
    ROWS: gl.constexpr = 8
    WIDE: gl.constexpr = 64 * gl.num_warps()
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, gl.num_warps()], [1, 0])
    zeros = gl.zeros([ROWS, WIDE], v_tile.dtype, layout=zl)
    for r in gl.static_range(BLOCK_N // ROWS):
        if (r + 1) * ROWS > valid:
            rows = r * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, zl))
            for g in gl.static_range(HEAD_DIM // WIDE):
                piece = v_tile.slice(r * ROWS, ROWS).slice(g * WIDE, WIDE, dim=1)
                if r * ROWS >= valid:  # wholly past the end
                    piece.store(zeros)
                else:  # the piece the end falls in
                    piece.store(gl.where((rows < valid)[:, None], piece.load(zl), zeros))
    fence_async_shared()
    gl.thread_barrier()



@gluon.constexpr_function
def _prod_dim(head_dim, prod_dim):
    """The head-dim columns the products cover: ``head_dim`` (``prod_dim`` 0), or three quarters of the
    tile, 192 of 256 or 96 of 128 (``hopper.split_cols_for``: a padded head dim of 136-192 or 72-96
    columns, whose tiles are 256 / 128 wide because Gluon's buffers and register tensors must have
    power-of-two shapes): the products then run over the tile's first half and the next quarter."""
    prod_dim = int(prod_dim)
    assert prod_dim in (0, int(head_dim)) or (int(head_dim) in (128, 256) and prod_dim == 3 * int(head_dim) // 4), \
        (head_dim, prod_dim)
    return int(head_dim) if prod_dim == 0 else prod_dim



@gluon.jit
def _qk_mma(q_smem, k_tile, s_zero, PROD_DIM: gl.constexpr, k_hi=None, slot=0):
    """Issue S = Q K^T asynchronously over the first ``PROD_DIM`` head-dim columns (``_prod_dim``): one
    product, or (three quarters of the tile) two chained ones, over its first half and the next
    quarter (192 of 256: columns 0:128 and 128:192; 96 of 128: 0:64 and 64:96), the second accumulating
    onto the first (two commit groups). The backward's S^T = K Q^T and dP^T = V dO^T are the same call
    with the operands in that order. ``k_hi``: the forward's split ring (``_split_ring``), K's columns
    128:PROD_DIM in a ring of their own (its tile at ``slot``), ``k_tile`` then 128 wide."""
    HEAD_DIM: gl.constexpr = k_tile.shape[1]
    if k_hi is not None:
        gl.static_assert(HEAD_DIM == 128 and k_hi.shape[2] == PROD_DIM - 128, "the split ring: 128 + 64 columns")
        s_tok = warpgroup_mma(q_smem.slice(0, 128, dim=1), k_tile.permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s_tok = warpgroup_mma(q_smem.slice(128, PROD_DIM - 128, dim=1), k_hi.index(slot).permute((1, 0)), s_tok,
                              is_async=True)
    elif PROD_DIM == HEAD_DIM:
        s_tok = warpgroup_mma(q_smem, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    else:
        LO: gl.constexpr = HEAD_DIM // 2
        s_tok = warpgroup_mma(q_smem.slice(0, LO, dim=1), k_tile.slice(0, LO, dim=1).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
        s_tok = warpgroup_mma(q_smem.slice(LO, PROD_DIM - LO, dim=1),
                              k_tile.slice(LO, PROD_DIM - LO, dim=1).permute((1, 0)), s_tok, is_async=True)
    return s_tok



@gluon.jit
def _softcap(s, softcap_a):
    """tanh(s * softcap_a) elementwise (softcap_a = softmax_scale / cap): the softcap's saturation,
    before the masks (tanh(-inf) would be -1, not -inf). ``tanh.approx.f32``: one MUFU.TANH an
    element (maximum relative error about 2**-11, below the bf16 / fp16 rounding of P V's operand)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [s * softcap_a], dtype=gl.float32,
                                     is_pure=True, pack=1)



MAGIC_BITS = gl.constexpr(0x4B400000)  # 1.5 * 2^23 as fp32's bits: (MAGIC_BITS + n) read as fp32 is MAGIC_F32 + n



@gluon.jit
def _magic_to_f32(biased):
    """n as fp32, exactly, from the int32 ``biased`` = MAGIC_BITS + n (|n| < 2^22): a bit cast and one
    FADD, no conversion instruction; the caller adds MAGIC_BITS where it folds (``_alibi``)."""
    return biased.to(gl.float32, bitcast=True) - MAGIC_F32


LOG2E = gl.constexpr(constants.LOG2E)



LN2 = gl.constexpr(constants.LN2)
P_SCALE = gl.constexpr(fp8.P_SCALE)  # FP8's P multiplier (``ioattn.reference.fp8``)
P_SCALE_LOG2 = gl.constexpr(int(math.log2(fp8.P_SCALE)))  # the softmax's max offset for it (``P_LOG2``)
FP8_BLOCK_ROWS = gl.constexpr(fp8.FP8_BLOCK_ROWS)  # rows an FP8 block descale covers
TRACE_EVENTS = gl.constexpr(constants.TRACE_EVENTS)  # stamps a critical section (``hopper_fwd_tile._stamp``)



ALIBI_FP32_COLS = gl.constexpr(_flags.ALIBI_FP32_COLS)  # the tile's columns held as fp32



MAGIC_F32 = gl.constexpr(12582912.0)  # for |n| < 2^22


ALIBI_MAGIC = gl.constexpr(_flags.ALIBI_MAGIC)  # ``ALIBI``'s forms: the distance by the magic-number conversion
