"""FP8 (e4m3) inputs: the checks every FP8 entry point shares (the forward, the KV cache), and
``quantize_fp8``, which makes them from float16, bfloat16 or float32 tensors.

A descale undoes a quantisation: the real value is ``fp8_value * descale``. FlashAttention-3's
interface gives one descale per (batch, KV head), shape ``(batch, nheads_kv)``; any shape that
broadcasts to it (a scalar tensor, ``(1, 1)``) means one descale for the whole tensor. The query's
descale may also be per query head, ``(batch, nheads)``. The query's and the key's may also be per
block of ``FP8_BLOCK_ROWS`` rows, ``(batch, heads, blocks)`` as ``quantize_fp8(..., "block")`` returns
them (blocks counted from each sequence's first row); the value's stays per head.
"""
from __future__ import annotations

import functools

import torch

from ioattn.launch.quantize import quantize_fp8 as launch_quantize
from ioattn.plan import dispatch
from ioattn.reference.decode import apply_rotary_ref
from ioattn.reference.fp8 import E4M3, E4M3_MAX, FP8_BLOCK_ROWS, P_SCALE  # noqa: F401  (the kernels' constants)
from ioattn.reference.fp8 import GRANULARITIES, quantize_fp8_ref, random_signs, rotate

__all__ = ["E4M3", "E4M3_MAX", "P_SCALE", "FP8_BLOCK_ROWS", "FP8_DTYPES", "is_fp8", "check_descale",
           "check_descale_values", "fp8_output_dtype", "descale_rows", "quantize_fp8"]

FP8_DTYPES = (E4M3,)


def is_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES


def check_descale(name: str, descale, batch: int, heads: int, device, other_heads: int | None = None,
                  blocks: int | None = None) -> torch.Tensor:
    """``descale`` as a contiguous float32 (batch, heads) tensor on ``device``; a clear error naming
    ``name`` otherwise. ``other_heads``: a second head count the descale may have instead (the query's
    own heads); the result then has that many. ``blocks``: a 3-D descale (batch, heads, blocks) is
    taken too, one per block of ``FP8_BLOCK_ROWS`` rows, and comes back as such. The values are
    checked by ``check_descale_values``."""
    if descale is None:
        raise ValueError(f"{name} is required with FP8 (float8_e4m3fn) inputs: the descale that undoes "
                         f"their quantisation, shape (batch, nheads_kv) = ({batch}, {heads}) or a scalar tensor")
    if not isinstance(descale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(descale).__name__}")
    if descale.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"{name} must be a floating-point tensor (float32), got {descale.dtype}")
    if descale.device != torch.device(device):
        raise ValueError(f"{name} must be on the inputs' device {device}, got {descale.device}")
    per_block = blocks is not None and descale.dim() == 3
    target = (batch, heads) + ((blocks,) if per_block else ())
    if other_heads is not None and descale.dim() in (2, 3) and descale.shape[1] == other_heads != heads:
        target = (batch, other_heads) + target[2:]
    try:
        full = descale.to(torch.float32).expand(target)
    except RuntimeError:
        allowed = f"({batch}, {heads})" + (f" or ({batch}, {other_heads})" if other_heads not in (None, heads) else "")
        if blocks is not None:
            allowed += f", or per block of {FP8_BLOCK_ROWS} rows ({batch}, heads, {blocks})"
        raise ValueError(f"{name} must broadcast to {allowed}, got shape {tuple(descale.shape)}") from None
    return full.contiguous()


def check_descale_values(name: str, descale: torch.Tensor) -> None:
    """Finite and positive, or a ValueError naming ``name`` (reads the tensor: one sync on a GPU)."""
    if descale.numel() and not bool(torch.isfinite(descale).all() & (descale > 0).all()):
        bad = descale[~(torch.isfinite(descale) & (descale > 0))].flatten()[:4].tolist()
        raise ValueError(f"{name} must hold finite positive values, got {bad}")


def fp8_output_dtype(out_dtype) -> torch.dtype:
    """The FP8 forward's output dtype: bfloat16 unless float16 is asked for."""
    if out_dtype is None:
        return torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float16 for FP8 inputs, got {out_dtype}")
    return out_dtype


def descale_rows(q_descale, k_descale, v_descale, batch: int, nheads: int, nheads_kv: int, device,
                 check_values: bool = True, blocks_q: int = 1, blocks_k: int = 1) -> torch.Tensor:
    """The FP8 forward's descales as one float32 tensor, the kernels' layout: per batch element a row of
    the query heads' descales, then the key heads', then the value heads', (batch, nheads + 2 *
    nheads_kv); with a query or key descale per block of ``FP8_BLOCK_ROWS`` rows (``blocks_q`` /
    ``blocks_k``: the longest sequences' block counts), both by block, (batch, nheads * blocks_q +
    nheads_kv * blocks_k + nheads_kv), each head's blocks in order (a per-head one repeated over them).
    A query descale given per KV head applies to every query head of its group. ``check_values``
    False: the values are not read (descales this library made: positive by construction), no sync."""
    q_ds = check_descale("q_descale", q_descale, batch, nheads_kv, device, other_heads=nheads, blocks=blocks_q)
    if q_ds.shape[1] != nheads:
        q_ds = q_ds.repeat_interleave(nheads // nheads_kv, dim=1)
    k_ds = check_descale("k_descale", k_descale, batch, nheads_kv, device, blocks=blocks_k)
    v_ds = check_descale("v_descale", v_descale, batch, nheads_kv, device)
    if q_ds.dim() == 3 or k_ds.dim() == 3:  # both by block, flattened head-major
        q_ds, k_ds = (t if t.dim() == 3 else t[:, :, None].expand(-1, -1, n)
                      for t, n in ((q_ds, blocks_q), (k_ds, blocks_k)))
        q_ds, k_ds = q_ds.reshape(batch, -1), k_ds.reshape(batch, -1)
    rows = torch.cat([q_ds, k_ds, v_ds], dim=1)
    # one read of the device for the three; a traced call (torch.compile) cannot read values: unchecked
    if check_values and not torch.compiler.is_compiling() and not bool((torch.isfinite(rows) & (rows > 0)).all()):
        for name, t in (("q_descale", q_ds), ("k_descale", k_ds), ("v_descale", v_ds)):
            check_descale_values(name, t)
    return rows


# ---------------------------------------------------------------- quantisation

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_HEADDIM = 256
_BLOCK_ELEMENTS = 32768  # one program holds a block of rows: block_rows x head dim, padded to powers of two


def quantize_fp8(x, granularity="tensor", hadamard=False, seed=0, block_rows=128, cu_seqlens=None,
                 rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    """(e4m3 ``values`` shaped like ``x``, float32 ``descale``) with x' ≈ values * descale, x' being
    ``x`` (batch, seqlen, heads, d), or (total, heads, d) with ``cu_seqlens``, after the optional
    rotary embedding (``rotary_cos/sin`` (seqlen_ro, rotary_dim / 2) at each row's position in its
    sequence, as in ``flash_attn_with_kvcache``) and, with ``hadamard``, the rotation (x * s) H of
    ``reference.fp8.rotate`` (s = ``random_signs(d, seed)``; power-of-two d only). Quantise q and k
    with the same ``seed`` to keep Q Kᵀ; V is not rotated. Descale shapes: () per ``"tensor"``,
    (batch, heads) per ``"head"``, (batch, heads, ceil(seqlen / block_rows)) per ``"block"``; packed
    blocks count from each sequence's start, 1 past its end. ``"block"`` reads x once; ``"tensor"``
    and ``"head"`` read it twice (the tiles' amax, then the scaling). Saturates at ±448; an all-zero
    group gets descale 1."""
    x = x.detach() if isinstance(x, torch.Tensor) else x
    max_seqlen, cu_list = _check_quantize(x, granularity, hadamard, seed, block_rows, cu_seqlens,
                                          rotary_cos, rotary_sin, rotary_interleaved)
    signs = _signs(x.shape[-1], seed, x.device) if hadamard else None
    if x.numel() == 0:
        return _empty_result(x, granularity, block_rows, max_seqlen, cu_list)
    # (under the interpreter, the e4m3 conversion is checked too: a build that rounds it wrongly is refused)
    if dispatch.use_triton(x.device, x.dtype) and dispatch.use_triton(x.device, E4M3):
        x = x if x.stride(-1) == 1 else x.contiguous()
        cos, sin = (None, None) if rotary_cos is None else (rotary_cos.contiguous(), rotary_sin.contiguous())
        return launch_quantize(x, granularity, block_rows, signs, cos, sin, rotary_interleaved, cu_seqlens,
                               max_seqlen, dispatch.cached_launch())
    return _quantize_torch(x, granularity, block_rows, signs, rotary_cos, rotary_sin, rotary_interleaved,
                           cu_list)


@functools.lru_cache(maxsize=64)
def _signs(d, seed, device):
    return random_signs(d, seed, device=device)


def _name(x):
    return x.dtype if isinstance(x, torch.Tensor) else type(x).__name__


def _check_quantize(x, granularity, hadamard, seed, block_rows, cu_seqlens, cos, sin, interleaved):
    """Every check of ``quantize_fp8``, before anything runs; returns (max_seqlen, cu_seqlens as a
    list or None), the offsets read back to the host once."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    for name, flag in (("hadamard", hadamard), ("rotary_interleaved", interleaved)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"block_rows must be a positive int, got {block_rows!r}")
    _check_x(x, cu_seqlens is not None)
    d = x.shape[-1]
    if hadamard and d & (d - 1):
        raise ValueError(f"hadamard=True needs a power-of-two head dim (the Walsh–Hadamard transform), got "
                         f"head dim {d} (x of shape {tuple(x.shape)})")
    block = (1 << (block_rows - 1).bit_length()) * (1 << (d - 1).bit_length())
    if granularity == "block" and block > _BLOCK_ELEMENTS:
        raise ValueError(f"block_rows={block_rows} with head dim {d}: one program holds a block, at most "
                         f"{_BLOCK_ELEMENTS} elements (block_rows x head dim, each padded to a power of two)")
    cu_list = _check_cu_seqlens(cu_seqlens, x) if cu_seqlens is not None else None
    max_seqlen = max((e - s for s, e in zip(cu_list, cu_list[1:])), default=0) if cu_list else x.shape[1]
    _check_rotary_tables(cos, sin, x, max_seqlen)
    return max_seqlen, cu_list


def _check_x(x, packed):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    want = "(total, heads, d) with cu_seqlens" if packed else "(batch, seqlen, heads, d)"
    if x.dim() != (3 if packed else 4):
        raise ValueError(f"x must be {want}, got shape {tuple(x.shape)}")
    if not 1 <= x.shape[-1] <= _MAX_HEADDIM:
        raise ValueError(f"x's head dim must be in [1, {_MAX_HEADDIM}], got shape {tuple(x.shape)}")


def _check_cu_seqlens(cu_seqlens, x):
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32:
        raise TypeError(f"cu_seqlens must be an int32 tensor (batch + 1,), got {_name(cu_seqlens)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must have shape (batch + 1,) with batch >= 1, got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens must be on x's device {x.device}, got {cu_seqlens.device}")
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != x.shape[0] or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to x's {x.shape[0]} rows (x of shape {tuple(x.shape)}), "
                         f"got {cu}")
    return cu


def _check_rotary_tables(cos, sin, x, max_seqlen):
    if (cos is None) != (sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together (or neither)")
    if cos is None:
        return
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {_name(t)}")
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if not 0 < 2 * cos.shape[1] <= x.shape[-1]:
        raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {2 * cos.shape[1]}) must be in (0, head dim "
                         f"{x.shape[-1]}]")
    if cos.shape[0] < max_seqlen:
        raise ValueError(f"rotary_cos/rotary_sin have {cos.shape[0]} rows but sequences of up to {max_seqlen} "
                         f"rows are rotated")


def _empty_result(x, granularity, block_rows, max_seqlen, cu_list):
    batch = len(cu_list) - 1 if cu_list else x.shape[0]
    shape = {"tensor": (), "head": (batch, x.shape[-2]),
             "block": (batch, x.shape[-2], -(-max_seqlen // block_rows))}[granularity]
    return torch.empty(x.shape, device=x.device, dtype=E4M3), torch.ones(shape, device=x.device)


def _quantize_torch(x, granularity, block_rows, signs, cos, sin, interleaved, cu_list):
    """The PyTorch path: the reference functions in float32."""
    xf = x.float()
    if cu_list is None:
        if cos is not None:
            positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
            xf = apply_rotary_ref(xf, cos, sin, positions, interleaved)
        return quantize_fp8_ref(rotate(xf, signs) if signs is not None else xf, granularity, block_rows)
    if cos is not None:
        positions = torch.cat([torch.arange(e - s) for s, e in zip(cu_list, cu_list[1:])]).to(x.device)
        xf = apply_rotary_ref(xf[None], cos, sin, positions[None], interleaved)[0]
    xf = rotate(xf, signs) if signs is not None else xf
    if granularity == "tensor":
        values, descale = quantize_fp8_ref(xf[None], "tensor")
        return values[0], descale
    blocks = -(-max(e - s for s, e in zip(cu_list, cu_list[1:])) // block_rows)
    descale = torch.ones(len(cu_list) - 1, x.shape[1], *((blocks,) if granularity == "block" else ()),
                         device=x.device)
    values = torch.empty(x.shape, device=x.device, dtype=E4M3)
    for b, (s, e) in enumerate(zip(cu_list, cu_list[1:])):
        if e > s:  # an empty sequence keeps descale 1, as an all-zero group
            v, part = quantize_fp8_ref(xf[s:e][None], granularity, block_rows)
            values[s:e] = v[0]
            descale[b][..., :part.shape[-1]] = part[0]
    return values, descale


# the rotation's signs of ``fp8=True`` (any fixed seed: q and k share it, so Q K^T is unchanged)
ONE_CALL_SEED = 0


def quantize_qkv(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
    """``flash_attn_func(..., fp8=True)``'s quantisation: (q8, k8, v8, (q_descale, k_descale, v_descale)),
    one scale per (batch, head) (per sequence with ``cu_seqlens``), and q and k rotated by one
    random-sign Hadamard matrix where the head dim is a power of two (incoherent processing; V is not
    rotated, so the output needs no inverse). q, k, v: bf16 or fp16, as validated by the caller. (Per
    block of rows, one pass each, measured slower in all: docs/decisions/fp8-forward.md.)"""
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"fp8=True takes bfloat16 or float16 q, k, v (it returns q's dtype), got {q.dtype}")
    d = q.shape[-1]
    rotate = d & (d - 1) == 0
    q8, qs = quantize_fp8(q, "head", hadamard=rotate, seed=ONE_CALL_SEED, cu_seqlens=cu_seqlens_q)
    k8, ks = quantize_fp8(k, "head", hadamard=rotate, seed=ONE_CALL_SEED, cu_seqlens=cu_seqlens_k)
    v8, vs = quantize_fp8(v, "head", cu_seqlens=cu_seqlens_k)
    return q8, k8, v8, (qs, ks, vs)
