"""``merge_attention_states``: the exact LSE merge of partial attention results, public.

The building block of split-KV decoding (each program attends to a slice of the cache) and of
attention spread over several devices (each rank attends to its shard of the keys)."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

from ioattn.plan import dispatch
from ioattn.launch.cached import launcher_for
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
        out, lse = _merge_triton(outs, lses)
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


def _merge_triton(outs, lses, lse_bhm=False, pdl=False, out=None, lse=None):
    """The merged output in the dtype of ``out`` if given, else of outs. ``lse_bhm``: outs are
    (S, batch, seqlen_q, nheads, d) and the lse is returned as (batch, nheads, seqlen_q) (decode).
    ``pdl``: launched with programmatic dependent launch right after the kernel that wrote outs and
    lses, which must have been launched with its USE_PDL (the decode split kernel). ``out`` /
    ``lse``: contiguous destinations of the merged shapes (else new tensors)."""
    from ioattn.kernels.combine import merge_states_kernel

    splits, lead, d = outs.shape[0], outs.shape[1:-1], outs.shape[-1]
    n_rows = lses[0].numel()
    o = outs.reshape(splits, n_rows, d)
    if o.stride(-1) != 1:
        o = o.contiguous()
    lse_in = lses.reshape(splits, n_rows).float().contiguous()
    nheads, seqlen_q = (lead[2], lead[1]) if lse_bhm else (1, 1)
    if out is None:
        out = torch.empty(n_rows, d, device=outs.device, dtype=outs.dtype)
    if lse is None:
        lse = torch.empty(n_rows, device=outs.device, dtype=torch.float32)
    assert out.is_contiguous() and out.numel() == n_rows * d and lse.is_contiguous() and lse.numel() == n_rows
    if n_rows:
        block_s = max(2, 1 << (splits - 1).bit_length())
        # the outputs are read at most 64 splits per load: 64 x 256 fp32 is 128 registers a thread at 4 warps
        launcher_for(merge_states_kernel)(
            (n_rows,), (o, lse_in, out, lse, n_rows, splits, o.stride(0), o.stride(1), lse_in.stride(0), nheads,
                        seqlen_q),
            dict(HEAD_DIM=d, BLOCK_D=dispatch.block_d(d), BLOCK_S=block_s, CHUNK_S=min(block_s, 64),
                 LSE_BHM=lse_bhm, num_warps=4, **({"USE_PDL": True, "launch_pdl": True} if pdl else {})),
            cached=dispatch.cached_launch())
    if lse_bhm:
        return out.reshape(*lead, d), lse.reshape(lead[0], nheads, seqlen_q)
    return out.reshape(*lead, d), lse.reshape(lead)
