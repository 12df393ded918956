"""FP8 (e4m3) quantisation of (batch, seqlen, heads, d) or packed (total, heads, d) rows, fused with
the optional rotary embedding and FlashAttention-3's incoherent processing (x -> (x * s) H).

One program holds a tile of rows of one (sequence, head) in float32 registers: load, rotary,
rotation, amax; then either the amax goes out (the first of two passes) or the rows are scaled,
rounded to e4m3 and stored. Reference twin: ``ioattn.reference.fp8`` (``rotate``,
``quantize_fp8_ref``) with ``ioattn.reference.decode.apply_rotary_ref``.
"""
import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def to_e4m3(v):
    """float32 ``v`` to e4m3, clamped to ±448 first: saturating, never NaN, on every backend (the
    conversion itself rounds to nearest even)."""
    return tl.minimum(tl.maximum(v, -E4M3_MAX), E4M3_MAX).to(tl.float8e4nv)


@triton.jit
def _hadamard(x, signs, BLOCK_M: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr, SQRT_D: tl.constexpr):
    """(x * signs) H for each row of ``x`` (BLOCK_M, D), H the normalised Walsh–Hadamard matrix.
    Each of the log2(D) identical stages maps a row y to [y_even + y_odd, y_even - y_odd]; applied
    log2(D) times this is Sylvester's H, with the additions of the usual in-place butterflies."""
    x = x * signs[None, :]
    for _ in tl.static_range(LOG_D):
        even, odd = tl.split(tl.reshape(x, [BLOCK_M, D // 2, 2]))
        x = tl.reshape(tl.permute(tl.join(even + odd, even - odd), (0, 2, 1)), [BLOCK_M, D])
    return tl.div_rn(x, SQRT_D)


@triton.jit
def _rotary(x, row_ptrs, Cos, Sin, pos, row_ok, stride_cos, cols,
            ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The rotary embedding of the rows ``x`` at positions ``pos``: feature j < ROTARY_DIM becomes
    x_j cos - x_partner sin (first of its pair) or x_j cos + x_partner sin (second). The partners
    are a second load of the same rows (served by the cache)."""
    HALF: tl.constexpr = ROTARY_DIM // 2
    if INTERLEAVED:  # GPT-J: pairs (2i, 2i + 1)
        partner, first, angle = cols ^ 1, cols % 2 == 0, cols // 2
    else:  # GPT-NeoX: pairs (i, i + rotary_dim / 2)
        partner, first = tl.where(cols < HALF, cols + HALF, cols - HALF), cols < HALF
        angle = tl.where(first, cols, cols - HALF)
    rot = row_ok[:, None] & (cols < ROTARY_DIM)[None, :]
    other = tl.load(row_ptrs + partner[None, :], mask=rot, other=0.0).to(tl.float32)
    table = pos[:, None] * stride_cos + angle[None, :]
    c = tl.load(Cos + table, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(Sin + table, mask=rot, other=0.0).to(tl.float32)
    sign = tl.where(first, -1.0, 1.0)
    return x * c + sign[None, :] * other * s


@triton.jit
def quantize_fp8_kernel(X, Values, Descale, Amax, Signs, Cos, Sin, CuSeqlens,
                        seqlen, rows_per_program, stride_xb, stride_xs, stride_xh,
                        stride_vb, stride_vs, stride_vh, stride_db, stride_dh, stride_ab, stride_ah, stride_cos,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                        PACKED: tl.constexpr, HADAMARD: tl.constexpr, LOG_D: tl.constexpr, SQRT_D: tl.constexpr,
                        ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
                        STORE_VALUES: tl.constexpr, OWN_DESCALE: tl.constexpr):
    """Grid (row tiles, heads, batch): ``rows_per_program`` rows (<= BLOCK_M) of one (sequence, head).

    * ``STORE_VALUES`` off: the tile's amax goes by atomic max into the zeroed cell ``Amax + b *
      stride_ab + h * stride_ah`` (first pass, per tensor or head: strides 0 per tensor); nothing else
      is written.
    * ``OWN_DESCALE``: the tile is one block; its descale (amax / 448, 1 for an all-zero block) goes
      to ``Descale[b, h, tile]`` and scales it.
    * otherwise (second pass) the descale is made of that cell's amax the same way, the group's first
      tile stores it at ``Descale + b * stride_db + h * stride_dh``, and it scales the tile.
    ``PACKED``: rows of sequence b are ``CuSeqlens[b] ..< CuSeqlens[b + 1]`` (``stride_xb`` 0)."""
    tile, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    if PACKED:
        start = tl.load(CuSeqlens + b).to(tl.int64)
        seqlen = tl.load(CuSeqlens + b + 1) - start
    else:
        start = 0
    offs = tl.arange(0, BLOCK_M)
    pos = tile * rows_per_program + offs
    row_ok = (offs < rows_per_program) & (pos < seqlen)
    cols = tl.arange(0, BLOCK_D)
    rows = start + pos.to(tl.int64)
    row_ptrs = X + b * stride_xb + rows[:, None] * stride_xs + h * stride_xh
    ok = row_ok[:, None] & (cols < HEAD_DIM)[None, :]
    x = tl.load(row_ptrs + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if ROTARY_DIM > 0:
        x = _rotary(x, row_ptrs, Cos, Sin, pos, row_ok, stride_cos, cols, ROTARY_DIM, INTERLEAVED)
    if HADAMARD:
        x = _hadamard(x, tl.load(Signs + cols), BLOCK_M, BLOCK_D, LOG_D, SQRT_D)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    cell = Amax + b * stride_ab + h * stride_ah
    if not STORE_VALUES:
        tl.atomic_max(cell, amax)
        return
    if not OWN_DESCALE:
        amax = tl.load(cell)
    descale = tl.div_rn(amax, E4M3_MAX)
    descale = tl.where(descale > 0, descale, 1.0)  # an all-zero group (or an amax that underflows)
    if OWN_DESCALE:
        tl.store(Descale + b * stride_db + h * stride_dh + tile, descale)
    else:
        tl.store(Descale + b * stride_db + h * stride_dh, descale, mask=tile == 0)
    out = Values + b * stride_vb + rows[:, None] * stride_vs + h * stride_vh + cols[None, :]
    tl.store(out, to_e4m3(tl.div_rn(x, descale)), mask=ok)
