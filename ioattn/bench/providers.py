"""Attention implementations measured side by side. Each provider is ``fn(q, k, v, causal)`` on
(batch, seqlen, nheads, headdim) tensors, or None with a reason when it cannot run here."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import ioattn


def _sdpa(backend):
    def run(q, k, v, causal):
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return run


def _ioattn(q, k, v, causal):
    return ioattn.flash_attn_func(q, k, v, causal=causal)


def _ioattn_tma(q, k, v, causal):
    """The forward with K/V through tensor descriptors (TMA), whatever the default is."""
    from ioattn import dispatch
    with dispatch.prefer_tma(True):
        return ioattn.flash_attn_func(q, k, v, causal=causal)


def providers(names=None):
    """Name -> (callable or None, reason). Unknown names get a reason, not an exception."""
    from torch.nn.attention import SDPBackend

    table = {"ioattn": (_ioattn, ""), "ioattn-tma": (_ioattn_tma, "")}
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa-math", SDPBackend.MATH)):
        table[name] = (_sdpa(backend), "")
    try:
        from flash_attn import flash_attn_func as fa2  # optional peer
        table["flash-attn"] = (lambda q, k, v, c: fa2(q, k, v, causal=c), "")
    except Exception as e:  # noqa: BLE001 - any import failure just means "not installed here"
        table["flash-attn"] = (None, f"flash_attn not importable: {type(e).__name__}")
    if names is None:
        return table
    return {n: table.get(n, (None, f"unknown provider {n!r}; known: {', '.join(table)}")) for n in names}
