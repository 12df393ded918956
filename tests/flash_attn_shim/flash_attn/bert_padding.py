"""Padding helpers with flash-attn's ``bert_padding`` interface: between padded ``(batch, seqlen,
...)`` tensors and the packed ``(total, ...)`` form the varlen functions take."""
import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Keep the tokens where ``attention_mask`` (batch, seqlen) is set (or ``unused_mask``: tokens
    that are allocated but unused still take a place in the packed tensor).

    Returns ``(packed (total, ...), indices (total,) into the flattened batch * seqlen,
    cu_seqlens int32 (batch + 1,), max_seqlen int, seqused int32 (batch,))``, where ``seqused``
    counts the tokens of ``attention_mask`` alone.
    """
    selected = attention_mask.bool()
    if unused_mask is not None:
        selected = selected | unused_mask.bool()
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = selected.flatten().nonzero().flatten()
    cu_seqlens = torch.zeros(seqlens.numel() + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = seqlens.cumsum(0)
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    packed = hidden_states.flatten(0, 1)[indices]
    return packed, indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of ``unpad_input``: ``(total, ...)`` back to ``(batch, seqlen, ...)``, zeros
    where no token was kept (differentiable in ``hidden_states``)."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_put((indices,), hidden_states)
    return out.unflatten(0, (batch, seqlen))
