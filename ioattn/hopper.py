"""Host side of the Gluon Hopper forward (``ioattn.kernels.hopper_forward``). EXPERIMENTAL and opt-in:
it compiles for sm_90 in CI but has not yet run on a device, so ``flash_attn_func`` uses it only
inside ``prefer_hopper(True)`` or with ``IOATTN_HOPPER=1``, and only for the calls it covers
(``hopper_supports``); every other call keeps the portable kernel. Gluon is imported lazily: a
Triton without it (or with a different Gluon API) still imports the package."""
from __future__ import annotations

import torch

from ioattn import dispatch


# Tiles: FlashAttention-3's published shapes for Hopper (128 x 128, two stages), not yet tuned here.
# (block_m, block_n, stages); warps = 4 per 64 query rows (one warpgroup each) + 1 producer warp.
TILES = {64: (128, 128, 2), 128: (128, 128, 2)}


prefer_hopper = dispatch.Preference(False, env="IOATTN_HOPPER")  # ``with prefer_hopper(True): ...``


def wanted() -> bool:
    return prefer_hopper.wanted()


def hopper_supports(q, k, v, varlen, window, softcap, alibi_slopes, dropout_p) -> tuple[bool, str]:
    """Whether the Gluon forward covers this call, and why not."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False, "needs an sm_90 (Hopper) GPU"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False, "fp16/bf16 only"
    if q.shape[-1] not in TILES:
        return False, f"head dims {sorted(TILES)} only"
    if varlen or window not in ((-1, -1), (-1, 0)) or softcap > 0 or alibi_slopes is not None or dropout_p > 0:
        return False, "no varlen, sliding window, softcap, ALiBi or dropout yet"
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return False, "contiguous inputs only (2-D descriptors over (batch * seqlen, nheads * d))"
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False, "this Triton has no Gluon"
    return True, ""


def hopper_forward(q, k, v, softmax_scale, causal):
    """(out, lse) as the portable forward returns them; the call must pass ``hopper_supports``."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ioattn.kernels.hopper_forward import hopper_fwd_kernel

    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    if q.numel() == 0 or seqlen_q == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    block_m, block_n, stages = TILES[d]
    dt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q_layout = gl.NVMMASharedLayout.get_default_for([block_m, d], dt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dt)
    q_desc = TensorDescriptor.from_tensor(q.view(batch * seqlen_q, nheads * d), [block_m, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(batch * seqlen_k, nheads_kv * d), [block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(batch * seqlen_k, nheads_kv * d), [block_n, d], kv_layout)
    grid = (dispatch.cdiv(seqlen_q, block_m) * batch * nheads,)
    hopper_fwd_kernel[grid](q_desc, k_desc, v_desc, out, lse, seqlen_q, seqlen_k, nheads, nheads // nheads_kv,
                            nheads * d, lse.stride(0), lse.stride(1), softmax_scale * 1.4426950408889634,
                            HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, IS_CAUSAL=bool(causal),
                            num_warps=4 * (block_m // 64))
    return out, lse
