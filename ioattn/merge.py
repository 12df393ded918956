"""``merge_attention_states``: the exact LSE merge of partial attention results, public.

The building block of split-KV decoding (each program attends to a slice of the cache) and of
attention spread over several devices (each rank attends to its shard of the keys)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ioattn.plan import dispatch
from ioattn.launch.merge import merge_states
from ioattn.reference.merge import merge_states_ref


LSE_LAYOUTS = ("out", "flash_attn")


def merge_attention_states(outs, lses, lse_layout="out"):
    """Combine attention results computed over disjoint key sets into attention over their union.

    ``outs``: a sequence of ``S`` tensors ``(..., nheads, headdim)`` (or one stacked tensor
    ``(S, ..., nheads, headdim)``), each the normalised output over one key set; ``lses``: the
    matching natural-log log-sum-exps, float32, in one of two layouts (``lse_layout``):

    * ``"out"`` (default): shaped like the output without its head dimension, ``(..., nheads)``;
    * ``"flash_attn"``: as ``flash_attn_func(..., return_attn_probs=True)`` returns it, heads before
      the sequence: ``(batch, nheads, seqlen_q)`` for outputs ``(batch, seqlen_q, nheads, d)``, and
      ``(nheads, total_q)`` for the varlen functions' ``(total_q, nheads, d)``.

    Returns ``(out (..., nheads, headdim) in the dtype of outs, lse float32)``, the lse in the layout
    it came in. A key set with lse -inf (no visible key) contributes nothing; rows where every set is
    empty give output 0 and lse -inf. Differentiable when any input requires grad (then it runs in
    plain torch ops); otherwise CUDA tensors use a Triton kernel.
    """
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"lse_layout must be one of {LSE_LAYOUTS}, got {lse_layout!r}")
    outs = _stack("outs", outs)
    lses = _stack("lses", lses)
    flash = lse_layout == "flash_attn"
    if flash:
        if outs.dim() < 4 or lses.dim() < 3:
            raise ValueError(f"lse_layout='flash_attn' needs outputs (..., seqlen, nheads, headdim) and lses "
                             f"(..., nheads, seqlen) per partial result, got outs {tuple(outs.shape)}, "
                             f"lses {tuple(lses.shape)}")
        lses = lses.transpose(-1, -2)  # (..., nheads, seqlen) -> (..., seqlen, nheads), a view
    if outs.dim() < 2 or lses.shape != outs.shape[:-1]:
        raise ValueError(_layout_message(outs, lses, flash))
    if outs.shape[0] == 0:
        raise ValueError("merge_attention_states needs at least one partial result, got 0")
    if not outs.is_floating_point() or not lses.is_floating_point():
        raise TypeError(f"outs and lses must be floating point, got {outs.dtype} and {lses.dtype}")
    if outs.device != lses.device:
        raise ValueError(f"outs and lses must be on one device, got {outs.device} and {lses.device}")
    if outs.requires_grad or lses.requires_grad or not dispatch.use_triton(outs.device):
        out, lse = merge_states_ref(outs, lses)
    else:
        out, lse = merge_states(outs, lses, block_d=dispatch.block_d(outs.shape[-1]), cached=dispatch.cached_launch())
    return (out, lse.transpose(-1, -2).contiguous()) if flash else (out, lse)


def _layout_message(outs, lses, flash):
    """The refusal for lses that do not fit outs; ``lses`` as seen in the "out" layout."""
    if flash:
        return (f"with lse_layout='flash_attn', lses must have the shape of outs without its head dim, "
                f"heads before the sequence: outs {tuple(outs.shape)}, lses {tuple(lses.transpose(-1, -2).shape)}")
    msg = (f"lses must have the shape of outs without its last (head) dimension: outs {tuple(outs.shape)}, "
           f"lses {tuple(lses.shape)}")
    if outs.dim() >= 4 and lses.dim() >= 2 and lses.transpose(-1, -2).shape == outs.shape[:-1]:
        msg += " (heads before the sequence, as flash_attn_func returns it: pass lse_layout='flash_attn')"
    return msg


def _stack(name, xs):
    if isinstance(xs, torch.Tensor):
        return xs
    if not isinstance(xs, Sequence) or not all(isinstance(x, torch.Tensor) for x in xs):
        raise TypeError(f"{name} must be a tensor or a sequence of tensors, got {type(xs).__name__}")
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) > 1:
        raise ValueError(f"every tensor in {name} must have one shape, got {sorted(shapes)}")
    return torch.stack(list(xs))
