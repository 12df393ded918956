"""The launch of ``kernels/block_mask.classify_blocks_kernel``: a block mask's classes on the device."""
from __future__ import annotations

import torch

from ioattn.kernels.block_mask import classify_blocks_kernel


def classify_blocks(mod, batch, nheads, seqlen_q, seqlen_k, block_q, block_k, device):
    """(batch, nheads, q blocks, k blocks) int8 classes of the traced mask ``mod`` (``ioattn.mods.Mod``)."""
    nq, nk = -(-seqlen_q // block_q), -(-seqlen_k // block_k)
    out = torch.empty(batch, nheads, nq, nk, dtype=torch.int8, device=device)
    sub_q = min(block_q, max(1, 4096 // block_k))  # a [sub_q, block_k] tile: 4096 mask values
    classify_blocks_kernel[(nq * nk, batch * nheads)](
        out, mod.kernel_captures(), nheads, seqlen_q, seqlen_k, nk, MASK_MOD=mod.module.mod, BQ=block_q,
        BK=block_k, SUB_Q=sub_q)
    return out
