"""Launches of the Gluon Hopper backward (``ioattn.kernels.hopper_backward_ws``, and the base
kernel of ``ioattn.kernels.hopper_backward``): the preprocess pass (D, lse, the zeroed dQ accumulator),
TMA descriptors, the kernel's arguments and dQ's scaling pass, from the policy in
``ioattn.plan.hopper_bwd``."""
import functools

import torch
from triton.experimental.gluon import language as gl

from ioattn.kernels import constants
from ioattn.kernels.backward import attn_bwd_preprocess_kernel, dq_from_blocks_kernel
from ioattn.kernels.hopper_backward import dq_flat_bases, hopper_bwd_dkdv_kernel
from ioattn.kernels.hopper_backward_ws import hopper_bwd_ws_kernel
from ioattn.launch import gluon_fwd
from ioattn.plan import hopper, hopper_bwd
from ioattn.layout import tma_rows_view
from ioattn.plan.hopper_bwd import BWD_NUM_WARPS, WS_DQ_SWIZZLE, dq_hi_first, kernel_config

KERNELS = {"hopper_bwd_dkdv_kernel": hopper_bwd_dkdv_kernel, "hopper_bwd_ws_kernel": hopper_bwd_ws_kernel}


def ws_layouts(d: int, dtype, softcap: bool = False, alibi: bool = False) -> dict:
    """Shared-memory layouts of the "ws" kernel's descriptors (Gluon dtype ``dtype``) at head dim
    ``d``, for ``kernel_config(d, "ws", softcap, alibi)``'s blocks: Q / dO and K / V as the base kernel's, the 1-D
    lse / D rows unswizzled, the fp32 dQ tile (``dq_cols`` wide) swizzled by ``WS_DQ_SWIZZLE`` (the
    launcher and the compile check share them)."""
    cfg = kernel_config(d, "ws", softcap, alibi)
    bm, bn = cfg["block_m"], cfg["block_n"]
    return dict(q=gl.NVMMASharedLayout.get_default_for([bm, d], dtype),
                kv=gl.NVMMASharedLayout.get_default_for([bn, d], dtype),
                stat=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1),
                dq=gl.NVMMASharedLayout(swizzle_byte_width=0 if cfg["dq_flat"] else WS_DQ_SWIZZLE[d],
                                        element_bitwidth=32, rank=2))


def hopper_backward(dout, q, k, v, out, lse, softmax_scale, causal, variant="base", deterministic=False,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, window=(-1, -1),
                    softcap=0.0, alibi_slopes=None):
    """(dq, dk, dv) for (batch, seqlen, heads, d) bf16/fp16 q, k, v (GQA allowed; contiguous or views of
    a packed tensor, ``layout.tma_rows_view``, else copied), d in (64, 128) (and 256 with variant
    "ws"), causal (bottom-right) or not; ``lse`` natural-log (batch, nheads, seqlen_q) fp32, as both
    forwards return it. ``variant``: one of ``BWD_VARIANTS``, the same results up to the order of the
    fp32 dQ additions, which are not bitwise reproducible except with ``deterministic=True`` ("ws").
    "ws" only: varlen (``cu_seqlens_q`` / ``cu_seqlens_k`` and the longest lengths; packed tensors, lse
    (nheads, total_q); rows no sequence owns get zero gradients), ``window`` (flash-attn's (left, right),
    bottom-right aligned; (-1, 0) is ``causal=True``), ``softcap`` > 0 (the forward's capped scores) and
    ``alibi_slopes`` (fp32 (nheads,) or (batch, nheads); softmax_scale nonzero without a softcap). No
    dropout. A head dim the kernels lack (``ioattn.plan.hopper.PADDED_RANGE``) runs at the next one, in place
    for "ws" with d a multiple of 8 (``hopper.padded_in_place``), else on zero-padded copies."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dp = hopper.padded_headdim(q.shape[-1])
    if dp:
        window = (-1, 0) if causal else tuple(int(w) for w in window)
        refusal = hopper.padded_refusal(q.shape[-1], cu_seqlens_q is not None, window, softcap, alibi_slopes)
        if refusal:
            raise ValueError(refusal)
        if variant != "ws" or not hopper.padded_in_place(q.shape[-1]):
            if hopper.call_forms(cu_seqlens_q is not None, window, softcap, alibi_slopes):
                raise ValueError(f"head dim {q.shape[-1]} with packed sequences, a window, a softcap or ALiBi: "
                                 f"the ws variant in place only (here variant {variant!r})")
            grads = hopper_backward(*(gluon_fwd.pad_head(t, dp) for t in (dout, q, k, v, out)), lse, softmax_scale,
                                    causal, variant=variant, deterministic=deterministic)
            return tuple(g[..., :q.shape[-1]].contiguous() for g in grads)
    varlen = cu_seqlens_q is not None
    nheads, io_dim = q.shape[-2], q.shape[-1]
    d = dp or io_dim  # the kernel's head dim; a padded call's tensors keep io_dim
    nheads_kv = k.shape[-2]
    if varlen:
        if variant != "ws":
            raise ValueError(f"varlen needs variant \"ws\", got {variant!r}")
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, int(max_seqlen_q), int(max_seqlen_k)
        assert q.dim() == 3 and cu_seqlens_k is not None and cu_seqlens_k.numel() == batch + 1
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        assert lse.shape == (nheads, q.shape[0]) and lse.stride(1) == 1 and lse.dtype == torch.float32
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        assert lse.shape == (batch, nheads, seqlen_q) and lse.stride(2) == 1 and lse.dtype == torch.float32
        lse_strides = (lse.stride(0), lse.stride(1))
    assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype and v.dtype == q.dtype
    assert nheads % nheads_kv == 0
    window = tuple(int(w) for w in window)
    if window == (-1, 0) and not causal:
        raise ValueError("window (-1, 0) is the causal mask: pass causal=True")
    has_window = window != (-1, -1) and not causal
    if causal and window not in ((-1, -1), (-1, 0)):
        raise ValueError(f"causal=True with window {window}: pass the window alone (its right side 0)")
    if has_window and variant != "ws":
        raise ValueError(f"a sliding window needs variant \"ws\", got {variant!r}")
    if not softcap >= 0:
        raise ValueError(f"softcap must be >= 0 (0: none), got {softcap}")
    if softcap > 0 and variant != "ws":
        raise ValueError(f"a softcap needs variant \"ws\", got {variant!r}")
    has_alibi = alibi_slopes is not None
    if has_alibi:
        if variant != "ws":
            raise ValueError(f"ALiBi needs variant \"ws\", got {variant!r}")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)) or alibi_slopes.dtype != torch.float32 \
                or alibi_slopes.stride(-1) != 1:
            raise ValueError(f"alibi_slopes must be fp32 of shape ({nheads},) or ({batch}, {nheads}) with unit "
                             f"head stride, got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
        if softcap <= 0 and softmax_scale == 0:
            raise ValueError("ALiBi needs softmax_scale != 0 here (the bias joins the scores in their units)")
        if hopper.alibi_length_refusal(q, k, varlen, hopper_bwd.bwd_alibi_form(d, softcap)):
            raise ValueError(hopper.alibi_length_refusal(q, k, varlen, hopper_bwd.bwd_alibi_form(d, softcap)))
    cfg = kernel_config(d, variant, softcap > 0, alibi_slopes is not None)
    if deterministic and variant != "ws":
        raise ValueError(f"deterministic=True needs variant \"ws\" (the ordered dQ mode), got {variant!r}")
    # the descriptors read 2-D (rows, heads * d) views: a packed qkv's views as they are, other layouts
    # (and dO with zero strides, as autograd passes for a sum) copied
    q, k, v, dout = (t if tma_rows_view(t) is not None else t.contiguous() for t in (q, k, v, dout))
    # varlen: zeros first, the kernels write only the rows some sequence owns
    grad_like = torch.zeros_like if varlen else torch.empty_like
    dk = grad_like(k, memory_format=torch.contiguous_format)
    dv = grad_like(v, memory_format=torch.contiguous_format)
    if q.numel() == 0 or k.numel() == 0 or seqlen_q == 0 or seqlen_k == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    # D = rowsum(dO * O) fp32 by the portable backward's preprocess kernel (one read of O and dO; the
    # torch expression it replaces made fp32 copies of both, ~1 GB of traffic at d=128 x 16k tokens x
    # 16 heads), written straight into the layout the variant reads: (batch, nheads, seqlen_q) for
    # "base"; for "ws" each head's row padded with zeros to a whole number of query blocks, so that
    # every 1-D TMA row tile stays inside its head and rows past seqlen_q read 0
    bm = cfg["block_m"]
    stat_stride = seqlen_q if variant == "base" else triton_cdiv(seqlen_q, bm) * bm
    out = out.contiguous()
    flat = variant == "ws" and cfg["dq_flat"]
    # (batch, sequence, head) strides of O and dO for the preprocess kernel (varlen: rows from cu_seqlens_q)
    o_strides = (0, out.stride(0), out.stride(1)) if varlen else (out.stride(0), out.stride(1), out.stride(2))
    do_strides = (0, dout.stride(0), dout.stride(1)) if varlen else (dout.stride(0), dout.stride(1), dout.stride(2))
    cu_q = cu_seqlens_q if varlen else q.new_empty(0, dtype=torch.int32)
    cu_k = cu_seqlens_k if varlen else q.new_empty(0, dtype=torch.int32)
    # "ws": lse in log2 units (-inf rows, which saw no key, -> 0: the base kernel's guard), padded as D;
    # with ``LSE_IN_ACC`` lse / softmax_scale instead, where S^T's accumulator starts (the same
    # exponent once the scores are scaled by softmax_scale * log2 e)
    consts = dict(cfg["constexprs"])
    if variant == "ws":
        consts["LSE_IN_ACC"] = consts["LSE_IN_ACC"] and softmax_scale > 0
    lse_unit = 1.0 / softmax_scale if consts.get("LSE_IN_ACC") else constants.LOG2E
    if variant == "ws":
        # One launch writes D, the lse rows and the zeroed flat dQ accumulator, in the padded layout the
        # kernel reads (FA3's preprocess does the same three jobs), in place of three fills and four
        # small element-wise kernels for the lse rows, whose fixed cost weighed at short lengths
        # (docs/decisions/backward-dq-path.md).
        delta = torch.empty(batch, nheads, stat_stride, device=q.device, dtype=torch.float32)
        lse2 = torch.empty_like(delta)
        if flat:  # at the kernel's head dim (a padded call's extra columns: zeros, never read back)
            dq_accum = torch.empty(batch * nheads * stat_stride * d, device=q.device, dtype=torch.float32)
        else:  # (rows, nheads, d), as dQ at the kernel's head dim
            dq_accum = torch.zeros(*q.shape[:-1], d, device=q.device, dtype=torch.float32)
        attn_bwd_preprocess_kernel[(stat_stride // 64 * batch * nheads,)](
            out, dout, delta, cu_q, *o_strides, *do_strides, delta.stride(0), delta.stride(1), nheads, seqlen_q,
            HEAD_DIM=io_dim, BLOCK_D=d, BLOCK_M=64, IS_VARLEN=varlen, Lse=lse, LseOut=lse2,
            DQacc=dq_accum if flat else delta, stride_slb=lse_strides[0], stride_slh=lse_strides[1],
            stat_rows=stat_stride, lse_unit=lse_unit, PADDED=True, ZERO_DQ=flat, DQ_DIM=d)
    else:  # "base": (batch, nheads, seqlen_q), as it was measured
        delta = torch.zeros(batch, nheads, stat_stride, device=q.device, dtype=torch.float32)
        attn_bwd_preprocess_kernel[(triton_cdiv(seqlen_q, 64) * batch * nheads,)](
            out, dout, delta, q.new_empty(0, dtype=torch.int32), out.stride(0), out.stride(1), out.stride(2),
            dout.stride(0), dout.stride(1), dout.stride(2), delta.stride(0), delta.stride(1), nheads, seqlen_q,
            HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64, IS_VARLEN=False)
        dq_accum = torch.zeros(batch, seqlen_q, nheads, d, device=q.device, dtype=torch.float32)

    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    bn = cfg["block_n"]
    grid = (triton_cdiv(seqlen_k, bn), batch * nheads_kv)
    if variant == "base":
        q_layout = gl.NVMMASharedLayout.get_default_for([bm, d], gdt)
        kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
    else:
        lay = ws_layouts(d, gdt, softcap > 0, has_alibi)
        q_layout, kv_layout = lay["q"], lay["kv"]
    if dp:  # the rows views in [.., d] boxes zero-filled past io_dim (the forward's)
        q_desc, do_desc = (gluon_fwd.padded_rows_desc(t, bm, d, gdt) for t in (q, dout))
        k_desc, v_desc = (gluon_fwd.padded_rows_desc(t, bn, d, gdt) for t in (k, v))
    else:
        q_desc = TensorDescriptor.from_tensor(tma_rows_view(q), [bm, d], q_layout)
        do_desc = TensorDescriptor.from_tensor(tma_rows_view(dout), [bm, d], q_layout)
        k_desc = TensorDescriptor.from_tensor(tma_rows_view(k), [bn, d], kv_layout)
        v_desc = TensorDescriptor.from_tensor(tma_rows_view(v), [bn, d], kv_layout)
    if variant == "base":
        hopper_bwd_dkdv_kernel[grid](q_desc, k_desc, v_desc, do_desc, lse, delta, dq_accum, dk, dv,
                                     seqlen_q, seqlen_k, nheads, nheads // nheads_kv,
                                     lse.stride(0), lse.stride(1), delta.stride(0), delta.stride(1),
                                     float(softmax_scale), float(softmax_scale) * constants.LOG2E,
                                     IS_CAUSAL=bool(causal), num_warps=cfg["num_warps"], **cfg["constexprs"])
    else:
        lse_desc = TensorDescriptor.from_tensor(lse2.view(-1), [bm], lay["stat"])
        delta_desc = TensorDescriptor.from_tensor(delta.view(-1), [bm], lay["stat"])
        dq_2d = dq_accum.view(-1, 32) if flat else dq_accum.view(-1, nheads * d)  # at the kernel's d
        dq_desc = TensorDescriptor.from_tensor(dq_2d, cfg["dq_block"], lay["dq"])
        # the products over 192 columns (hopper.bwd_split_cols): dQ's high half 64 columns wide
        prod_dim = hopper.bwd_split_cols_for(d, io_dim if dp else 0, consts["COL_SPLIT"])
        dq_hi_desc = TensorDescriptor.from_tensor(dq_2d, [bm, prod_dim - d // 2], lay["dq"]) if prod_dim else None
        # a window's unbounded side: a bound past every row of either length (the kernel's arithmetic
        # adds it to row indices, so no larger than int32 needs)
        unbounded = seqlen_q + seqlen_k + 1
        # one counter per (batch, head, query block) orders the dQ additions (deterministic only)
        sem = torch.zeros(batch * nheads * triton_cdiv(seqlen_q, bm) if deterministic else 1, device=q.device,
                          dtype=torch.int32)
        hopper_bwd_ws_kernel[grid](q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk, dv, sem,
                                   cu_q, cu_k, seqlen_q, seqlen_k, nheads, nheads // nheads_kv, stat_stride,
                                   # with a softcap the scores reach the exponentials as tanh(s * softcap_a): the
                                   # cap times log2 e scales them (the Gluon forward's convention)
                                   float(softmax_scale), (softcap if softcap > 0 else softmax_scale) * constants.LOG2E,
                                   *((w if w >= 0 else unbounded for w in window) if has_window else (0, 0)),
                                   softmax_scale / softcap if softcap > 0 else 0.0,
                                   # ALiBi: the slope to the scores' units (as the forward's)
                                   -1.0 / (softcap if softcap > 0 else softmax_scale) if has_alibi else 0.0,
                                   alibi_slopes.stride(0) if has_alibi and alibi_slopes.dim() == 2 else 0,
                                   ALIBI=hopper_bwd.bwd_alibi_form(d, softcap) if has_alibi else 0,
                                   Alibi=alibi_slopes if has_alibi else q.new_empty(0, dtype=torch.float32),
                                   IS_CAUSAL=bool(causal), DETERMINISTIC=bool(deterministic), IS_VARLEN=varlen,
                                   WINDOW=has_window, IO_DIM=io_dim if dp else 0,
                                   PROD_DIM=prod_dim, dq_hi_desc=dq_hi_desc,
                                   DQ_HI_FIRST=dq_hi_first(d, consts["COL_SPLIT"], prod_dim),
                                   num_warps=cfg["num_warps"], **consts)
    if flat:
        return dq_from_flat(dq_accum, q, bm, softmax_scale, cu_q if varlen else None, stat_stride // bm, d), dk, dv
    # one pass: scale and cast into dQ (``(dq_accum * scale).to(dtype)`` made an fp32 copy first)
    dq = torch.mul(dq_accum[..., :io_dim], softmax_scale,
                   out=torch.empty_like(q, memory_format=torch.contiguous_format))
    return dq, dk, dv


def dq_from_flat(dq_accum, q, block_m, scale, cu_seqlens_q=None, n_m=None, acc_dim=None):
    """dQ (q's shape and dtype) = scale * the flat accumulator (``WS_DQ_FLAT``: per (batch, head,
    query block) a [block_m, d] block in ``dq_flat_bases`` order), in one pass of the portable
    ``dq_from_blocks_kernel``: the order is a permutation of the coordinates' bits, so an element's
    offset is a row part plus a column part (two small tables); a torch copy through a view of 2 x ...
    x 2 dimensions costs a fixed share at short lengths (docs/decisions/backward-dq-path.md).
    Varlen (``cu_seqlens_q``; q packed (total_q, nheads, d)): ``n_m`` blocks per (batch, head), block m
    of sequence b to rows cu_seqlens_q[b] + m * block_m on; rows no sequence owns are 0. ``acc_dim``:
    the accumulator's head dim where it is q's zero-padded (a padded call in place), its first q.shape[-1]
    columns stored."""
    varlen = cu_seqlens_q is not None
    nheads, d = q.shape[-2], acc_dim or q.shape[-1]
    if varlen:
        batch, seqlen_q = cu_seqlens_q.numel() - 1, 0
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
        strides = (0, dq.stride(0), dq.stride(1))
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        n_m = triton_cdiv(seqlen_q, block_m)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        strides = (dq.stride(0), dq.stride(1), dq.stride(2))
    row_off, col_off = _flat_offset_tables(block_m, d, str(q.device))
    dq_from_blocks_kernel[(batch * nheads * n_m,)](dq_accum, row_off, col_off, dq, seqlen_q, nheads, n_m, *strides,
                                                  float(scale), cu_seqlens_q if varlen else row_off,
                                                  BLOCK_M=block_m, HEAD_DIM=d, IS_VARLEN=varlen,
                                                  D_OUT=q.shape[-1] if q.shape[-1] != d else 0, num_warps=4)
    return dq


@functools.lru_cache(maxsize=None)
def _flat_offset_tables(block_m, d, device):
    """int32 (row part, column part) of the flat offsets of a [block_m, d] block, per device."""
    row_off, col_off = [0] * block_m, [0] * d
    for bit, (r, c) in enumerate(dq_flat_bases(BWD_NUM_WARPS, block_m, d)):
        for i in range(block_m):
            row_off[i] += (1 << bit) if r and i & r else 0
        for j in range(d):
            col_off[j] += (1 << bit) if c and j & c else 0
    return (torch.tensor(row_off, dtype=torch.int32, device=device),
            torch.tensor(col_off, dtype=torch.int32, device=device))


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
