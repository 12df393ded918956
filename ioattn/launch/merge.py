"""Launches of the LSE merge (``ioattn.kernels.combine.merge_states_kernel``): for
``merge_attention_states`` (``ioattn.merge``) and for the split units of a decode step
(``ioattn.launch.decode``)."""
from __future__ import annotations

import torch

from ioattn.launch.cached import launcher_for


def merge_states(outs, lses, *, block_d, cached, lse_bhm=False, pdl=False, out=None, lse=None):
    """The merged output in the dtype of ``out`` if given, else of outs. ``block_d``: the kernel's
    padded head dim; ``cached``: through ``launch.cached``. ``lse_bhm``: outs are (S, batch,
    seqlen_q, nheads, d) and the lse is returned as (batch, nheads, seqlen_q) (decode). ``pdl``:
    launched with programmatic dependent launch right after the kernel that wrote outs and lses,
    which must have been launched with its USE_PDL (the decode split kernel). ``out`` / ``lse``:
    contiguous destinations of the merged shapes (else new tensors)."""
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
        # (wider heads: as many splits as keep that, 32 at 512)
        launcher_for(merge_states_kernel)(
            (n_rows,), (o, lse_in, out, lse, n_rows, splits, o.stride(0), o.stride(1), lse_in.stride(0), nheads,
                        seqlen_q),
            dict(HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=block_s, CHUNK_S=min(block_s, 64 * 256 // max(block_d, 256)),
                 LSE_BHM=lse_bhm, num_warps=4, **({"USE_PDL": True, "launch_pdl": True} if pdl else {})),
            cached=cached)
    if lse_bhm:
        return out.reshape(*lead, d), lse.reshape(lead[0], nheads, seqlen_q)
    return out.reshape(*lead, d), lse.reshape(lead)
