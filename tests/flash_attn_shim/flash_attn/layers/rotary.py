"""``flash_attn.layers.rotary.apply_rotary_emb`` in plain PyTorch (ioattn's rotary reference)."""
import torch

from ioattn.reference.decode import apply_rotary_ref


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """Rotary embedding of the first ``2 * cos.shape[1]`` features of ``x`` (batch, seqlen, nheads,
    headdim); token ``i`` of sequence ``b`` takes row ``i + seqlen_offsets[b]`` (or ``+ int``) of
    ``cos``/``sin`` (seqlen_rotary, rotary_dim / 2). ``interleaved``: GPT-J pairs, else GPT-NeoX
    halves. The packed form (``cu_seqlens``) is not provided here."""
    if cu_seqlens is not None:
        raise NotImplementedError("apply_rotary_emb: cu_seqlens (packed sequences) is not provided by this shim")
    batch, seqlen = x.shape[:2]
    positions = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
    if isinstance(seqlen_offsets, torch.Tensor):
        positions = positions + seqlen_offsets.to(device=x.device, dtype=torch.long).reshape(-1, 1)
    else:
        positions = positions + int(seqlen_offsets)
    out = apply_rotary_ref(x, cos, sin, positions, interleaved)
    if inplace:
        x.copy_(out)
        return x
    return out
