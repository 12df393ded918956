"""Attention implementations measured side by side.

Each provider is ``fn(q, k, v, causal) -> out`` on flash-attn's layout (batch, seqlen, nheads,
headdim), or ``None`` with the reason it cannot run here (never silently dropped). Names: ours start
with ``ioattn``; peers are ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``, ``sdpa-math``, ``flex``,
``flash-attn`` and ``flash-attn-cute``.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import ioattn

PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex", "flash-attn", "flash-attn-cute")
OURS = ("ioattn", "ioattn-tma")


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


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)

    @functools.lru_cache(maxsize=16)
    def causal_mask(sq, sk, device):
        # bottom-right aligned, like every other provider here
        offset = sk - sq
        return create_block_mask(lambda b, h, i, j: j <= i + offset, None, None, sq, sk, device=device)

    def run(q, k, v, causal):
        bm = causal_mask(q.shape[1], k.shape[1], str(q.device)) if causal else None
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm,
                       enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return run


def _import_peer(name):
    """flash-attn (FA2, CUDA) and flash-attn's CuTe kernels (FA4), when installed."""
    if name == "flash-attn":
        from flash_attn import flash_attn_func as fa2
        return lambda q, k, v, c: fa2(q, k, v, causal=c)
    from flash_attn.cute import flash_attn_func as fa_cute

    def run(q, k, v, causal):
        out = fa_cute(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    return run


def providers(names=None):
    """Name -> (callable or None, reason). Unknown names get a reason, not an exception."""
    from torch.nn.attention import SDPBackend

    table = {"ioattn": (_ioattn, ""), "ioattn-tma": (_ioattn_tma, "")}
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa-math", SDPBackend.MATH)):
        table[name] = (_sdpa(backend), "")
    wanted = set(table) | set(PEERS) if names is None else set(names)
    if "flex" in wanted:
        try:
            table["flex"] = (_flex(), "")
        except Exception as e:  # noqa: BLE001 - an old torch without FlexAttention
            table["flex"] = (None, f"FlexAttention unavailable: {type(e).__name__}: {e}")
    for peer in ("flash-attn", "flash-attn-cute"):
        if peer in wanted:
            try:
                table[peer] = (_import_peer(peer), "")
            except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
                table[peer] = (None, f"not importable here ({type(e).__name__})")
    if names is None:
        return table
    known = ", ".join(list(OURS) + list(PEERS))
    return {n: table.get(n, (None, f"unknown provider {n!r}; known: {known}")) for n in names}
