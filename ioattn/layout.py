"""Tensor layout helpers every layer may use: plain views of a tensor's storage, no policy."""
from __future__ import annotations

import torch


def tma_rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` (batch, seqlen, heads, d), or packed varlen (total, heads, d), as the 2-D (rows, heads * d)
    view the Gluon kernels' descriptors read, sharing ``t``'s storage; None where no such view exists.
    It exists when the head dim is contiguous, the heads are packed next to it (stride d), a batch
    steps by whole sequences (stride(0) == seqlen * stride(1)) and the rows neither overlap nor break
    TMA's rules (16-byte aligned base and row stride). Contiguous tensors qualify, and so do the
    views of a packed tensor: ``qkv.unbind(2)`` of (batch, seqlen, 3, heads, d), as
    ``flash_attn_qkvpacked_func`` / ``kvpacked`` take them, or a fused projection's slices. A
    (batch, heads, seqlen, d) tensor transposed to (batch, seqlen, heads, d) does not."""
    if t.dim() not in (3, 4) or t.numel() == 0:
        return None
    heads, d = t.shape[-2], t.shape[-1]
    if (d > 1 and t.stride(-1) != 1) or (heads > 1 and t.stride(-2) != d):
        return None
    lead = [(n, s) for n, s in zip(t.shape[:-2], t.stride()[:-2]) if n > 1]  # (batch,) seqlen / total
    row = lead[-1][1] if lead else heads * d
    if len(lead) == 2 and lead[0][1] != lead[1][0] * row:
        return None
    if row < heads * d or (row * t.element_size()) % 16 or t.data_ptr() % 16:
        return None
    return t.as_strided((t.numel() // (heads * d), heads * d), (row, 1))


def output_like(q: torch.Tensor, v: torch.Tensor, dtype: torch.dtype | None = None, zeros: bool = False) -> torch.Tensor:
    """The attention output's buffer for ``q`` and ``v``: q's leading dims and layout with V's head dim
    (``dtype``: q's by default; ``zeros``: filled with 0). Where V's head dim is q's, ``empty_like(q)``
    (q's strides kept); else a contiguous tensor."""
    if v.shape[-1] == q.shape[-1]:
        return torch.zeros_like(q, dtype=dtype) if zeros else torch.empty_like(q, dtype=dtype)
    alloc = torch.zeros if zeros else torch.empty
    return alloc(*q.shape[:-1], v.shape[-1], dtype=q.dtype if dtype is None else dtype, device=q.device)
