"""FP8 (e4m3) inputs: the checks every FP8 entry point shares (the forward, the KV cache).

A descale undoes a quantisation: the real value is ``fp8_value * descale``. FlashAttention-3's
interface gives one descale per (batch, KV head), shape ``(batch, nheads_kv)``; any shape that
broadcasts to it (a scalar tensor, ``(1, 1)``) means one descale for the whole tensor. The query's
descale may also be per query head, ``(batch, nheads)``.
"""
from __future__ import annotations

import torch

from ioattn.reference.fp8 import E4M3, E4M3_MAX, P_SCALE  # noqa: F401  (the kernels' constants)

FP8_DTYPES = (E4M3,)


def is_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES


def check_descale(name: str, descale, batch: int, heads: int, device, other_heads: int | None = None) -> torch.Tensor:
    """``descale`` as a contiguous float32 (batch, heads) tensor on ``device``; a clear error naming
    ``name`` otherwise. ``other_heads``: a second head count the descale may have instead (the query's
    own heads); the result then has that many. The values are checked by ``check_descale_values``."""
    if descale is None:
        raise ValueError(f"{name} is required with FP8 (float8_e4m3fn) inputs: the descale that undoes "
                         f"their quantisation, shape (batch, nheads_kv) = ({batch}, {heads}) or a scalar tensor")
    if not isinstance(descale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(descale).__name__}")
    if descale.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"{name} must be a floating-point tensor (float32), got {descale.dtype}")
    if descale.device != torch.device(device):
        raise ValueError(f"{name} must be on the inputs' device {device}, got {descale.device}")
    target = (batch, heads)
    if other_heads is not None and descale.dim() == 2 and descale.shape[1] == other_heads != heads:
        target = (batch, other_heads)
    try:
        full = descale.to(torch.float32).expand(target)
    except RuntimeError:
        allowed = f"({batch}, {heads})" + (f" or ({batch}, {other_heads})" if other_heads not in (None, heads) else "")
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


def descale_rows(q_descale, k_descale, v_descale, batch: int, nheads: int, nheads_kv: int, device) -> torch.Tensor:
    """The FP8 forward's descales as one float32 (batch, nheads + 2 * nheads_kv) tensor: each row the
    query heads' descales, then the key heads', then the value heads' (the kernels' layout). A query
    descale given per KV head applies to every query head of its group."""
    q_ds = check_descale("q_descale", q_descale, batch, nheads_kv, device, other_heads=nheads)
    if q_ds.shape[1] != nheads:
        q_ds = q_ds.repeat_interleave(nheads // nheads_kv, dim=1)
    k_ds = check_descale("k_descale", k_descale, batch, nheads_kv, device)
    v_ds = check_descale("v_descale", v_descale, batch, nheads_kv, device)
    rows = torch.cat([q_ds, k_ds, v_ds], dim=1)
    if not bool((torch.isfinite(rows) & (rows > 0)).all()):  # one read of the device for the three
        for name, t in (("q_descale", q_ds), ("k_descale", k_ds), ("v_descale", v_ds)):
            check_descale_values(name, t)
    return rows
