"""Page 3: recomputation in the backward.

The forward keeps O and one log-sum-exp per row; the backward rebuilds S = Q Kᵀ and P = exp(S − lse)
one key block at a time. ``backward_steps`` replays ``ioattn.reference.tiled.flash_backward``'s loop
(key blocks outside, query blocks inside) and records what each key block rebuilds; ``data`` checks
the recomputed P against standard attention's and the gradients against ``flash_backward`` and
autograd through ``attention_ref``.
"""
from __future__ import annotations

import torch

from ioattn.explainers.numbers import max_diff, name, plain, randn
from ioattn.reference.naive import attention_ref, scores_ref
from ioattn.reference.tiled import flash2_forward, flash_backward

SEED = 0
SEQLEN, HEAD_DIM, BLOCK = 8, 4, 2
# the memory comparison: bf16 tensors (2 bytes), float32 lse (4 bytes), one head of head dim 128
BYTES, LSE_BYTES, MEMORY_HEAD_DIM = 2, 4, 128
MEMORY_SEQLENS = [2 ** p for p in range(8, 18)]


def inputs():
    """q, k, v and the output's gradient dO, each (1, 8, 1, 4) float64, from ``SEED``."""
    return randn(SEED, *[(1, SEQLEN, 1, HEAD_DIM)] * 4)


def backward_steps(q, k, v, out, dout, lse):
    """flash_backward's loop on one head (no mask, every query block sees every key block): per key
    block, the rebuilt S, P, dP and dS columns, dV and dK of its keys, and dQ so far."""
    q, k, v, o, do = (t[0, :, 0] for t in (q, k, v, out, dout))
    scale = HEAD_DIM ** -0.5
    delta = (do * o).sum(-1)  # D_i = dO_i · O_i
    dq = torch.zeros_like(q)
    record = []
    for n0 in range(0, SEQLEN, BLOCK):
        cols = slice(n0, n0 + BLOCK)
        s = (q @ k[cols].T) * scale                  # S = Q K_jᵀ, rebuilt
        p = torch.exp(s - lse[:, None])              # P = exp(S - lse), rebuilt
        dv = p.T @ do                                # dV_j = P_jᵀ dO
        dp = do @ v[cols].T                          # dP = dO V_jᵀ
        ds = p * (dp - delta[:, None])               # dS = P ∘ (dP - D)
        dq = dq + (ds @ k[cols]) * scale             # dQ += dS K_j
        dk = (ds.T @ q) * scale                      # dK_j = dSᵀ Q
        record.append(dict(cols=[n0, n0 + BLOCK], s=s, p=p, dp=dp, ds=ds, dv=dv, dk=dk, dq=dq.clone()))
    return record


def _autograd(q, k, v, dout):
    """dQ, dK, dV of standard attention (``attention_ref``) by autograd."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = attention_ref(*leaves)
    return torch.autograd.grad(out, leaves, dout)


def memory_table():
    """Bytes kept for the backward per head, by sequence length: standard attention's P (N²) and
    FlashAttention's lse (N), both besides O (N d); and the backward's matmul FLOPs of each."""
    rows = []
    for n in MEMORY_SEQLENS:
        rows.append(dict(n=n, p_bytes=BYTES * n * n, o_bytes=BYTES * n * MEMORY_HEAD_DIM, lse_bytes=LSE_BYTES * n,
                         flops_standard=4 * 2 * n * n * MEMORY_HEAD_DIM,   # dV, dP, dQ, dK
                         flops_flash=5 * 2 * n * n * MEMORY_HEAD_DIM))     # and S = Q Kᵀ again
    return rows


def data() -> dict:
    """Page 3's numbers: the forward's O and lse, standard attention's P, the backward's steps per
    key block, the gradients and their checks, and the memory table."""
    q, k, v, dout = inputs()
    out, lse = flash2_forward(q, k, v, block_m=BLOCK, block_n=BLOCK)
    lse = lse[0, 0]
    p_std = torch.softmax(scores_ref(q, k, HEAD_DIM ** -0.5)[0, 0], dim=-1)
    record = backward_steps(q, k, v, out, dout, lse)
    dq, dk, dv = flash_backward(q, k, v, out, dout, lse[None, None], block_m=BLOCK, block_n=BLOCK)
    auto = _autograd(q, k, v, dout)
    dk_steps = torch.cat([st["dk"] for st in record])
    dv_steps = torch.cat([st["dv"] for st in record])
    return dict(
        source=(f"computed at build time from seed {SEED} (torch.randn, float64): O and lse by "
                f"{name(flash2_forward)}, the key-block loop of {name(flash_backward)} replayed, the gradients "
                f"checked against {name(flash_backward)} and autograd through {name(attention_ref)}"),
        seqlen=SEQLEN, head_dim=HEAD_DIM, block=BLOCK,
        out=plain(out[0, :, 0]), lse=plain(lse), p_std=plain(p_std),
        steps=[{key: val if key == "cols" else plain(val) for key, val in st.items()} for st in record],
        p_diff=[max_diff(st["p"], p_std[:, st["cols"][0]:st["cols"][1]]) for st in record],
        grads={"dq": plain(dq[0, :, 0]), "dk": plain(dk[0, :, 0]), "dv": plain(dv[0, :, 0])},
        diff_flash_backward={"dq": max_diff(record[-1]["dq"], dq[0, :, 0]), "dk": max_diff(dk_steps, dk[0, :, 0]),
                             "dv": max_diff(dv_steps, dv[0, :, 0])},
        diff_autograd={"dq": max_diff(dq, auto[0]), "dk": max_diff(dk, auto[1]), "dv": max_diff(dv, auto[2])},
        memory=dict(head_dim=MEMORY_HEAD_DIM, bytes=BYTES, lse_bytes=LSE_BYTES, rows=memory_table()))
