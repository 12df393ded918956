"""Launches of the Gluon Hopper backward (``ioattn.kernels.hopper_backward_ws``) from its plan
(``ioattn.plan.backward``): the preprocess pass (D, the lse rows, the zeroed dQ accumulator), TMA
descriptors, the kernel's arguments and dQ's scaling pass."""
import functools

import torch
from triton.experimental.gluon import language as gl

from ioattn.kernels.backward import attn_bwd_preprocess_kernel, dq_from_blocks_kernel
from ioattn.kernels.hopper_backward import dq_flat_bases
from ioattn.kernels.hopper_backward_ws import hopper_bwd_ws_kernel
from ioattn.launch import gluon_fwd
from ioattn.launch.cached import BoundLaunch
from ioattn.layout import tma_rows_view

KERNELS = {"hopper_bwd_ws_kernel": hopper_bwd_ws_kernel}


def ws_layouts(dtype, block_m: int, block_n: int, d: int, dq_swizzle: int) -> dict:
    """Shared-memory layouts of the ws kernel's descriptors (Gluon dtype ``dtype``) at head dim ``d``:
    Q / dO in [block_m, d] boxes, K / V in [block_n, d], the 1-D lse / D rows unswizzled, the fp32 dQ
    tile swizzled by ``dq_swizzle`` bytes (0: the flat tile); the launcher and the compile check share them."""
    return dict(q=gl.NVMMASharedLayout.get_default_for([block_m, d], dtype),
                kv=gl.NVMMASharedLayout.get_default_for([block_n, d], dtype),
                stat=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1),
                dq=gl.NVMMASharedLayout(swizzle_byte_width=dq_swizzle, element_bitwidth=32, rank=2))


class BackwardLaunch:
    """``plan``'s backward for tensors laid out as the example ones (shapes, strides, dtype, 16-byte
    alignment): the descriptors' layouts, the three kernels' scalars and their compiled forms are made
    once here; a call allocates, views its tensors as rows, rebases the descriptors and launches the
    preprocess pass, the ws kernel and dQ's scaling pass. ``functions``: a call's mask function
    (``{"MASK_MOD": ...}``, ``plan.backward.plan_backward_mods``), whose run-time arguments each call
    passes as ``mod_args`` (``ModCall.gluon_backward_args``)."""

    def __init__(self, plan, dout, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, alibi_slopes=None,
                 cached=True, functions=None):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        self.plan, self.cacheable = plan, True
        varlen, d, io_dim = plan.varlen, plan.head_dim, q.shape[-1]
        nheads, nheads_kv = q.shape[-2], k.shape[-2]
        self.batch = batch = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
        self.empty = q.numel() == 0 or k.numel() == 0 or plan.seqlen_q == 0 or plan.seqlen_k == 0
        if self.empty:
            return
        # the example's rows views (of a contiguous copy where a tensor has none: the same at each call)
        tensors, rows = zip(*(gluon_fwd.rows_of(t) for t in (q, k, v, dout)))
        self.views = tuple((tma_rows_view(t) is not None, view.shape, view.stride())
                           for t, view in zip((q, k, v, dout), rows))
        bm, bn, stat = plan.block_m, plan.block_n, plan.stat_stride
        gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        lay = ws_layouts(gdt, bm, bn, d, plan.dq_swizzle)
        if plan.pad_to:  # the rows views in [.., d] boxes zero-filled past io_dim (the forward's)
            descs = [gluon_fwd.padded_rows_desc(t, box, d, gdt) for t, box in zip(tensors, (bm, bn, bn, bm))]
        else:
            descs = [TensorDescriptor.from_tensor(r, [box, d], lay["q" if box_q else "kv"])
                     for r, box, box_q in zip(rows, (bm, bn, bn, bm), (True, False, False, True))]
        self.descs = tuple(gluon_fwd.unbased(desc) for desc in descs)
        self.stat_shape = (batch, nheads, stat)
        f32 = torch.float32
        self.stat_desc = gluon_fwd.template_desc((batch * nheads * stat,), (1,), (bm,), lay["stat"], f32, q.device)
        if plan.dq_flat:  # at the kernel's head dim (a padded call's extra columns: zeros, never read back)
            self.acc_shape, self.acc_rows = (batch * nheads * stat * d,), (batch * nheads * stat * d // 32, 32)
        else:  # (rows, nheads, d), as dQ at the kernel's head dim
            self.acc_shape, self.acc_rows = (*q.shape[:-1], d), (q.shape[:-2].numel(), nheads * d)
        acc_strides = (self.acc_rows[1], 1)
        self.dq_desc = gluon_fwd.template_desc(self.acc_rows, acc_strides, plan.dq_block, lay["dq"], f32, q.device)
        self.dq_hi_desc = None if plan.dq_hi_block is None else gluon_fwd.template_desc(
            self.acc_rows, acc_strides, plan.dq_hi_block, lay["dq"], f32, q.device)
        nothing = torch.empty(0, device=q.device, dtype=torch.int32)
        self.no_cu = None if varlen else nothing
        lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
        out_c = out.contiguous()

        def bhs(t):  # (batch, sequence, head) strides (varlen: rows from cu_seqlens_q)
            return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))
        self.pre = BoundLaunch(attn_bwd_preprocess_kernel, dict(
            zip(("stride_ob", "stride_om", "stride_oh"), bhs(out_c)),
            **dict(zip(("stride_dob", "stride_dom", "stride_doh"), bhs(dout))),
            stride_lb=nheads * stat, stride_lh=stat, nheads=nheads, seqlen_q_max=plan.seqlen_q, HEAD_DIM=io_dim,
            BLOCK_D=d, BLOCK_M=64, IS_VARLEN=varlen, stride_slb=lse_strides[0], stride_slh=lse_strides[1],
            stat_rows=stat, lse_unit=plan.lse_unit, PADDED=True, ZERO_DQ=plan.dq_flat, DQ_DIM=d),
            ("Out", "dOut", "Delta", "cu_seqlens_q", "Lse", "LseOut", "DQacc"), {}, direct=cached)
        self.pre_grid = (stat // 64 * batch * nheads,)
        consts = dict(plan.constexprs)
        dynamic = ("q_desc", "k_desc", "v_desc", "do_desc", "lse_desc", "delta_desc", "dq_desc", "dK", "dV", "Sem",
                   "Cu_q", "Cu_k", "Alibi", "dq_hi_desc")
        if functions is not None:  # a mask function: its captures and the block mask's lists at each call
            consts.update(functions)
            dynamic += ("mods", "blocks")
        self.ws = BoundLaunch(hopper_bwd_ws_kernel, dict(
            seqlen_q=plan.seqlen_q, seqlen_k=plan.seqlen_k, nheads=nheads, group=nheads // nheads_kv,
            stat_stride=stat, softmax_scale=plan.softmax_scale, qk_scale=plan.qk_scale,
            win_left=plan.win_left, win_right=plan.win_right, softcap_a=plan.softcap_a, alibi_unit=plan.alibi_unit,
            stride_ab=alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
            **consts), dynamic, dict(num_warps=plan.num_warps), direct=cached)
        self.no_alibi = nothing.float()
        self.sem = None if dict(plan.constexprs)["DETERMINISTIC"] else torch.zeros(
            1, device=q.device, dtype=torch.int32)
        if plan.dq_flat:
            self.n_m = stat // bm
            self.dq_pass = _dq_pass(q, d, bm, plan.consumer_warps, varlen, plan.seqlen_q, self.n_m, cached)

    def __call__(self, dout, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, alibi_slopes=None,
                 mod_args=()):
        plan = self.plan
        varlen = plan.varlen
        # varlen: zeros first, the kernels write only the rows some sequence owns
        alloc = torch.zeros if varlen else torch.empty
        dk = alloc(k.shape, dtype=k.dtype, device=k.device)
        dv = alloc(v.shape, dtype=v.dtype, device=v.device)
        if self.empty:
            return torch.zeros(q.shape, dtype=q.dtype, device=q.device), dk.zero_(), dv.zero_()
        # the descriptors read 2-D (rows, heads * d) views: a packed qkv's views as they are, other layouts
        # (and dO with zero strides, as autograd passes for a sum) copied
        q, k, v, dout = ((t if in_place else t.contiguous()) for t, (in_place, _, _) in zip((q, k, v, dout), self.views))
        out = out.contiguous()
        cu_q = cu_seqlens_q if varlen else self.no_cu
        # D, the lse rows (log2 units, or lse / scale with LSE_IN_ACC; -inf rows -> 0) and the zeroed flat
        # dQ accumulator in one launch, each head's rows padded to whole query blocks (reading 0 past
        # seqlen_q): docs/decisions/backward-dq-path.md
        delta = torch.empty(self.stat_shape, device=q.device, dtype=torch.float32)
        lse2 = torch.empty(self.stat_shape, device=q.device, dtype=torch.float32)
        acc = (torch.empty if plan.dq_flat else torch.zeros)(self.acc_shape, device=q.device, dtype=torch.float32)
        self.pre(self.pre_grid, out, dout, delta, cu_q, lse, lse2, acc if plan.dq_flat else delta)
        rows = [t.as_strided(shape, stride) for t, (_, shape, stride) in zip((q, k, v, dout), self.views)]
        q_desc, k_desc, v_desc, do_desc = (gluon_fwd.rebased(desc, r) for desc, r in zip(self.descs, rows))
        acc_rows = acc.view(self.acc_rows)
        dq_hi = None if self.dq_hi_desc is None else gluon_fwd.rebased(self.dq_hi_desc, acc_rows)
        # one counter per (batch, head, query block) orders the dQ additions (deterministic only; else
        # never read, one kept for every call)
        sem = self.sem if self.sem is not None else torch.zeros(plan.semaphores, device=q.device, dtype=torch.int32)
        self.ws(plan.grid, q_desc, k_desc, v_desc, do_desc, gluon_fwd.rebased(self.stat_desc, lse2.view(-1)),
                gluon_fwd.rebased(self.stat_desc, delta.view(-1)), gluon_fwd.rebased(self.dq_desc, acc_rows), dk, dv,
                sem, cu_q, cu_seqlens_k if varlen else self.no_cu,
                self.no_alibi if alibi_slopes is None else alibi_slopes, dq_hi, *mod_args)
        if plan.dq_flat:
            dq = alloc(q.shape, dtype=q.dtype, device=q.device)
            self.dq_pass((self.batch * q.shape[-2] * self.n_m,), acc, dq, plan.softmax_scale,
                         cu_q if varlen else self.dq_pass.static["RowOff"])  # (varlen only: any int32 pointer)
            return dq, dk, dv
        # one pass: scale and cast into dQ (``(dq_accum * scale).to(dtype)`` made an fp32 copy first)
        dq = torch.mul(acc[..., :q.shape[-1]], plan.softmax_scale, out=torch.empty(q.shape, dtype=q.dtype, device=q.device))
        return dq, dk, dv


def dq_from_flat(dq_accum, q, block_m, scale, warps, cu_seqlens_q=None, n_m=None, acc_dim=None):
    """dQ (q's shape and dtype) = scale * the flat accumulator (``WS_DQ_FLAT``: per (batch, head,
    query block) a [block_m, d] block in ``dq_flat_bases`` order for ``warps`` consumer warps), in one pass
    of the portable ``dq_from_blocks_kernel``: the order is a permutation of the coordinates' bits, so an
    element's offset is a row part plus a column part (two small tables; docs/decisions/backward-dq-path.md).
    Varlen (``cu_seqlens_q``; q packed (total_q, nheads, d)): ``n_m`` blocks per (batch, head), block m
    of sequence b to rows cu_seqlens_q[b] + m * block_m on; rows no sequence owns are 0. ``acc_dim``:
    the accumulator's head dim where it is q's zero-padded (a padded call in place), its first q.shape[-1]
    columns stored."""
    varlen = cu_seqlens_q is not None
    nheads, d = q.shape[-2], acc_dim or q.shape[-1]
    if varlen:
        batch, seqlen_q = cu_seqlens_q.numel() - 1, 0
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        n_m = -(-seqlen_q // block_m)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    launch = _dq_pass(q, d, block_m, warps, varlen, seqlen_q, n_m, cached=False)
    launch((batch * nheads * n_m,), dq_accum, dq, float(scale), cu_seqlens_q if varlen else launch.static["RowOff"])
    return dq


def _dq_pass(q, d, block_m, warps, varlen, seqlen_q, n_m, cached):
    """``dq_from_blocks_kernel``'s launch for ``dq_from_flat`` into a contiguous dQ shaped as ``q``; the
    accumulator, dQ, the scale and cu_seqlens_q are the launch's."""
    nheads, io_dim = q.shape[-2], q.shape[-1]
    row_off, col_off = _flat_offset_tables(block_m, d, warps, str(q.device))
    strides = (0, nheads * io_dim, io_dim) if varlen else (q.shape[1] * nheads * io_dim, nheads * io_dim, io_dim)
    return BoundLaunch(dq_from_blocks_kernel, dict(
        RowOff=row_off, ColOff=col_off, seqlen_q=seqlen_q, nheads=nheads, num_m=n_m,
        **dict(zip(("stride_b", "stride_m", "stride_h"), strides)), BLOCK_M=block_m, HEAD_DIM=d, IS_VARLEN=varlen,
        D_OUT=io_dim if io_dim != d else 0), ("Acc", "dQ", "scale", "cu_seqlens_q"), dict(num_warps=4), direct=cached)


@functools.lru_cache(maxsize=None)
def _flat_offset_tables(block_m, d, warps, device):
    """int32 (row part, column part) of the flat offsets of a [block_m, d] block, per device."""
    row_off, col_off = [0] * block_m, [0] * d
    for bit, (r, c) in enumerate(dq_flat_bases(warps, block_m, d)):
        for i in range(block_m):
            row_off[i] += (1 << bit) if r and i & r else 0
        for j in range(d):
            col_off[j] += (1 << bit) if c and j & c else 0
    return (torch.tensor(row_off, dtype=torch.int32, device=device),
            torch.tensor(col_off, dtype=torch.int32, device=device))
