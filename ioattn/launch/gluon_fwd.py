"""Launches of the Gluon Hopper forward (``ioattn.kernels.hopper_forward.hopper_fwd_kernel``) from its plan
(``ioattn.plan.forward``): the output and lse buffers, TMA descriptors (head-padded ones included),
the persistent walk's table and the kernel's arguments."""
from __future__ import annotations

import functools

import torch

from ioattn.layout import tma_rows_view


# (device, programs, batch_heads, kv_tiles, group_heads, tile cost) -> int32 tensor. Never evicted: a
# captured CUDA graph reads the table by address on every replay (a table is 4 bytes a tile: 16 KB
# for 16k tokens at d = 64)
_WALK_TABLES: dict = {}


def pad_head(t: torch.Tensor, dp: int) -> torch.Tensor:
    """``t`` (..., d) as a contiguous (..., dp) tensor, columns d.. zero (``F.pad``, faster than a
    concatenation with an expanded zero: docs/decisions/padded-head-dims.md)."""
    return torch.nn.functional.pad(t, (0, dp - t.shape[-1]))


def padded_rows_desc(t: torch.Tensor, block_rows: int, dp: int, gdtype):
    """The 3-D descriptor the Gluon kernels read a head-padded tensor through (``padded_in_place``): ``t``'s
    (rows, nheads * d) view (``layout.tma_rows_view``) with its column split into 8-column groups
    (stride 8 elements, 16 bytes) and an offset bounded by d, in [1, block_rows, dp] boxes: a box at
    (head * d / 8, row, 0) reads the head's d columns and zeros past them (the kernels' ``_load_rows``).
    The groups run to the last head's first one, so every address the descriptor spans lies in ``t``'s rows."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = tma_rows_view(t)
    d = t.shape[-1]
    layout = gl.NVMMASharedLayout.get_default_for([1, block_rows, dp], gdtype)
    return TensorDescriptor(rows, [(t.shape[-2] - 1) * d // 8 + 1, rows.shape[0], d], [8, rows.stride(0), 1],
                            [1, block_rows, dp], layout)


def padded_out_desc(out: torch.Tensor, block_rows: int, dp: int, gdtype):
    """The persistent forward's output copy (``ROW_STORES`` = 3) for a head-padded call: the contiguous
    (batch, seqlen_q, nheads, d) output as 4-D (column group of 8, batch, seqlen_q, d) in [1, 1,
    block_rows, dp] boxes, so the copy drops the rows past seqlen_q and the columns past d (the kernel's
    ``_store_rows_tma``)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, seqlen_q, nheads, d = out.shape
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, block_rows, dp], gdtype)
    return TensorDescriptor(out, [(nheads - 1) * d // 8 + 1, batch, seqlen_q, d],
                            [8, seqlen_q * nheads * d, nheads * d, 1], [1, 1, block_rows, dp], layout)


def build_walk_table(programs: int, batch_heads: int, kv_tiles: tuple, group_heads: int,
                     tile_cost: float) -> list:
    """The causal persistent walk as the kernel's ``Walk`` reads it (``hopper_tiles._walk``):
    ``[steps] + [tile of program p at step k for k in 0 .. steps, p in 0 .. programs)``, a tile as
    ``_tile_bhm``'s LPT encoding j * batch_heads + bh (query block num_m - 1 - j of (batch, head) bh),
    ``batch_heads * num_m`` (no tile) past a program's walk, one row past the longest walk.
    ``kv_tiles[m]``: key tiles query block m sees (``num_m`` = its length). Tiles go in LPT order
    (longest first) within each group of ``group_heads`` consecutive (batch, head)s, the groups in
    turn, each to the program whose modelled work (``tile_cost`` + key tiles a tile) ends first, the lower program on a tie: greedy list scheduling, so the
    walks end within about a tile of each other, and the programs at work at any time share a
    group's K / V in L2."""
    import heapq

    num_m = len(kv_tiles)
    num_tiles = batch_heads * num_m
    walks = [[] for _ in range(programs)]
    free = [(0.0, p) for p in range(programs)]  # (modelled time the program frees, program)
    for g0 in range(0, batch_heads, group_heads):
        for j in range(num_m):  # the group's longest query blocks first
            m = num_m - 1 - j
            cost = tile_cost + max(0, kv_tiles[m])
            for bh in range(g0, min(batch_heads, g0 + group_heads)):
                t_free, p = heapq.heappop(free)
                walks[p].append(j * batch_heads + bh)
                heapq.heappush(free, (t_free + cost, p))
    steps = max(len(w) for w in walks)
    return [steps] + [walks[p][k] if k < len(walks[p]) else num_tiles
                      for k in range(steps + 1) for p in range(programs)]


def _capturing(device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream (no host copy allowed)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def walk_table_tensor(device, programs: int, batch_heads: int, kv_tiles: tuple, group_heads: int,
                      tile_cost: float) -> torch.Tensor | None:
    """``build_walk_table``'s table as an int32 tensor on ``device``, built once a shape (a host-to-
    device copy), or None when a shape's first call comes inside a CUDA graph's capture, where that
    copy is not allowed (the launcher then takes the computed walk)."""
    key = (str(device), programs, batch_heads, kv_tiles, group_heads, tile_cost)
    table = _WALK_TABLES.get(key)
    if table is None:
        if _capturing(device):
            return None
        table = torch.tensor(build_walk_table(programs, batch_heads, kv_tiles, group_heads, tile_cost),
                             dtype=torch.int32,
                             device=device)
        _WALK_TABLES[key] = table
    return table


@functools.lru_cache(maxsize=16)
def device_sms(device) -> int:
    """The device's SM count; without a GPU (a plan explained on the CPU) an H100 / H200's 132."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def rows_of(t):
    """``t`` as TMA reads it: its (rows, nheads * d) view, made contiguous first where it has none."""
    view = tma_rows_view(t)
    if view is None:
        t = t.contiguous()
        view = tma_rows_view(t)
    return t, view


def rebased(desc, base):
    """A copy of descriptor ``desc`` over ``base``, a tensor of the same shape, strides and dtype as
    ``desc.base`` (so the checks ``desc`` passed hold; its 16-byte alignment is in the caller's key)."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


def unbased(desc):
    """``desc`` without its base tensor (a template ``rebased`` copies: the cache keeps no tensor alive)."""
    desc.base = None
    return desc


def template_desc(shape, strides, block, layout, dtype, device):
    """A descriptor template (``unbased``) of ``shape`` and ``strides``, made over a one-element tensor of
    ``dtype``: no buffer of the full size is allocated to prepare a launch."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    base = torch.empty(1, dtype=dtype, device=device)
    return unbased(TensorDescriptor(base, list(shape), list(strides), list(block), layout))


class ForwardLaunch:
    """``plan``'s launches for tensors laid out as the example ``q, k, v`` (shapes, strides, dtype,
    16-byte alignment; cu_seqlens and ALiBi slopes likewise): the descriptors' shapes and layouts, the
    walk table, the kernel's scalars and its compiled form are made once here, and a call allocates the
    outputs, views its tensors as rows, rebases the descriptors and launches. ``cacheable``: False when
    it was made inside a CUDA graph's capture without the walk table (it then computes the walk).
    ``functions``: a call's score / mask functions (``ModCall.functions``), whose run-time arguments each
    call passes as ``mod_args`` (``ModCall.gluon_forward_args``, a block mask's lists for ``q_block``'s
    query blocks)."""

    def __init__(self, plan, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, alibi_slopes=None, cached=True,
                 out_dtype=None, trace=None, functions=None):
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from ioattn.kernels.hopper_forward import hopper_fwd_kernel
        from ioattn.kernels.hopper_tiles import magic_divisor
        from ioattn.launch.cached import BoundLaunch

        consts = dict(plan.constexprs)
        self.plan, self.varlen, self.cacheable = plan, consts["IS_VARLEN"], True
        self.q_block = consts.get("Q_BLOCK", 0)
        self.fp8 = q.dtype == torch.float8_e4m3fn
        self.out_dtype = out_dtype or q.dtype
        d, nheads = plan.head_dim, q.shape[-2]
        self.batch = cu_seqlens_q.numel() - 1 if self.varlen else q.shape[0]
        self.lse_shape = (nheads, q.shape[0]) if self.varlen else (self.batch, nheads, plan.seqlen_q)
        self.empty = q.numel() == 0 or plan.num_m == 0 or (self.varlen and (k.numel() == 0 or plan.seqlen_k == 0))
        if self.empty:
            return
        dt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}[q.dtype]
        if plan.negate_q:  # the call's q is negated first: its layout is the negation's
            q = -q
        # the example's rows views (of a contiguous copy where a tensor has none: the same at each call)
        tensors, rows = zip(*(rows_of(t) for t in (q, k, v)))
        self.views = tuple((tma_rows_view(t) is not None, view.shape, view.stride()) for t, view in zip((q, k, v), rows))
        if plan.ring_split:  # the split ring: K / V in 128- and 64-column boxes (from column 128)
            descs = [padded_rows_desc(tensors[0], plan.q_rows, d, dt)] + [
                padded_rows_desc(tensors[i], plan.block_n, w, dt) for w in (128, 64) for i in (1, 2)]
        elif plan.pad_to:  # the same views, read in [.., d] boxes zero-filled past io_dim
            descs = [padded_rows_desc(tensors[0], plan.q_rows, d, dt)] + [
                padded_rows_desc(tensors[i], plan.block_n, d, dt) for i in (1, 2)]
        else:
            kv_layout = _layout(plan.block_n, d, dt)
            descs = [TensorDescriptor.from_tensor(rows[0], [plan.q_rows, d], _layout(plan.q_rows, d, dt)),
                     TensorDescriptor.from_tensor(rows[1], [plan.block_n, d], kv_layout),
                     TensorDescriptor.from_tensor(rows[2], [plan.block_n, d], kv_layout)]
        if self.fp8:  # V read transposed (``transposed_v``): a template over its (heads * d, keys) view
            self.v_batch = (self.batch, plan.seqlen_k) if self.varlen else None
            vt_shape, vt_strides = transposed_v_view(self._v_shape(v))
            descs[2] = template_desc(vt_shape, vt_strides, (d, plan.block_n), _layout(d, plan.block_n, dt), v.dtype,
                                     v.device)
        # (descriptor without its base, which tensor's rows it reads: 0 q, 1 k, 2 v)
        self.descs = tuple((unbased(desc), i) for desc, i in zip(descs, (0, 1, 2, 1, 2)))
        self.o_desc = None
        if plan.out_tma:  # the output as (batch, seqlen_q, nheads * d) in [1, q_rows, d] boxes: a bulk copy
            # drops the rows past seqlen_q itself (the persistent kernel's, fixed-length calls only)
            if plan.pad_to:  # (its shape alone is read: a one-element tensor expanded to it)
                self.out_view = q.shape
                self.o_desc = unbased(padded_out_desc(torch.empty(1, dtype=q.dtype, device=q.device).expand(q.shape),
                                                      plan.q_rows, d, dt))
            else:
                self.out_view = (self.batch, plan.seqlen_q, nheads * d)
                self.o_desc = template_desc(self.out_view, (plan.seqlen_q * nheads * d, nheads * d, 1),
                                            (1, plan.q_rows, d), _layout(plan.q_rows, d, dt, rank=3), q.dtype, q.device)
        walk, walk_div = None, plan.walk_div
        if plan.walk_table is not None:  # the causal walk from the host's table, else computed in the kernel
            walk = walk_table_tensor(q.device, plan.programs, self.batch * nheads, *plan.walk_table)
            if walk is None:  # a new shape inside a CUDA graph's capture: the computed walk, its options
                consts, walk_div = dict(plan.without_table[0]), plan.without_table[1]
                self.cacheable = False
        _, walk_mul, walk_shift = magic_divisor(walk_div)
        _, head_mul, head_shift = magic_divisor(nheads)
        lse_strides = (0, q.shape[0]) if self.varlen else (nheads * plan.seqlen_q, plan.seqlen_q)
        static = dict(seqlen_q=plan.seqlen_q, seqlen_k=plan.seqlen_k, nheads=nheads, group=nheads // k.shape[-2],
                      stride_om=nheads * plan.io_dim, stride_lse_b=lse_strides[0], stride_lse_h=lse_strides[1],
                      qk_scale=plan.qk_scale, walk_div=walk_div, walk_mul=walk_mul, walk_shift=walk_shift,
                      head_mul=head_mul, head_shift=head_shift, win_left=plan.win_left, win_right=plan.win_right,
                      softcap_a=plan.softcap_a, alibi_unit=plan.alibi_unit, num_tiles=plan.num_tiles, Walk=walk,
                      stride_ab=alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
                      **consts)
        if trace is not None:  # the schedule record (``schedule_trace``)
            static.update(Trace=trace, trace_sections=trace.shape[2])
        dynamic = ["q_desc", "k_desc", "v_desc", "o_desc", "Out", "Lse", "Cu_q", "Cu_k", "Alibi", "k_hi_desc",
                   "v_hi_desc"] + (["Descales"] if self.fp8 else [])
        if functions is not None:  # score / mask functions (``plan_forward_mods``): their arguments at each call
            static.update(functions)
            dynamic += ["mods", "blocks"]
        self.kernel = BoundLaunch(hopper_fwd_kernel, static, dynamic, dict(num_warps=plan.num_warps), direct=cached)

    def __call__(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, alibi_slopes=None, descales=None,
                 mod_args=()):
        plan = self.plan
        if self.varlen:  # zeros / -inf first: the kernel writes only rows some sequence owns
            out = torch.zeros(q.shape, dtype=self.out_dtype, device=q.device)
            lse = torch.full(self.lse_shape, float("-inf"), device=q.device, dtype=torch.float32)
        else:
            out = torch.empty(q.shape, dtype=self.out_dtype, device=q.device)
            lse = torch.empty(self.lse_shape, device=q.device, dtype=torch.float32)
        if self.empty:
            return out.zero_(), lse.fill_(float("-inf"))
        if plan.negate_q:
            q = -q
        rows = [(t if in_place else t.contiguous()).as_strided(shape, stride)
                for t, (in_place, shape, stride) in zip((q, k, v), self.views)]
        if self.fp8:
            rows[2] = transposed_v(v, cu_seqlens_k, self._v_shape(v))
        descs = [rebased(desc, rows[i]) for desc, i in self.descs]
        descs += [None] * (5 - len(descs))
        o_desc = None if self.o_desc is None else rebased(self.o_desc, out.view(self.out_view))
        extra = ((descales,) if self.fp8 else ()) + tuple(mod_args)
        self.kernel((plan.programs,), descs[0], descs[1], descs[2], o_desc, out, lse, cu_seqlens_q, cu_seqlens_k,
                    alibi_slopes, descs[3], descs[4], *extra)
        return out, lse

    def _v_shape(self, v):
        """V's (batch, keys, nheads_kv, d) as ``transposed_v`` lays it out: packed sequences as a batch
        of the longest."""
        return (*self.v_batch, *v.shape[1:]) if self.varlen else tuple(v.shape)


def transposed_v_view(shape):
    """(shape, strides) of ``transposed_v``'s result for a (batch, keys, nheads_kv, d) V: rows of keys,
    one a (batch, head, column), each 16-byte aligned (the keys rounded up to 16; TMA reads the
    first ``keys`` of a row, zero-filling past them)."""
    batch, keys, heads, d = shape
    return (batch * heads * d, keys), (-(-keys // 16) * 16, 1)


def transposed_v(v, cu_seqlens_k=None, shape=None):
    """V (batch, keys, nheads_kv, d) as FP8's P V product reads it: keys contiguous (8-bit wgmma takes
    its B operand K-major only), as the (batch * nheads_kv * d, keys) view of ``transposed_v_view``.
    Packed V (total, nheads_kv, d) with ``cu_seqlens_k``: ``shape`` (sequences, longest, nheads_kv, d),
    each sequence in its own rows from key 0, zeros past its end (a tile the sequence's end cuts reads
    no other sequence's values); rows no sequence owns are left out."""
    shape = tuple(v.shape) if shape is None else shape
    (rows, keys), (stride, _) = transposed_v_view(shape)
    batch, _, heads, d = shape
    if cu_seqlens_k is None:
        buf = torch.empty(batch, heads, d, stride, dtype=v.dtype, device=v.device)
        buf[..., :keys].copy_(v.permute(0, 2, 3, 1))
    else:  # one scatter: token t of sequence b to column t - cu[b] of b's rows (a spare batch takes the rest)
        buf = torch.zeros(batch + 1, heads, d, stride, dtype=torch.uint8, device=v.device)
        token = torch.arange(v.shape[0], device=v.device, dtype=cu_seqlens_k.dtype)
        seq = torch.searchsorted(cu_seqlens_k[1:], token, right=True)
        owned = seq < batch
        col = torch.where(owned, token - cu_seqlens_k[seq.clamp(max=batch - 1)], 0).clamp(0, stride - 1)
        buf.permute(0, 3, 1, 2)[seq.long(), col.long()] = v.view(torch.uint8)
        buf = buf[:batch].view(v.dtype)
    return buf.view(rows, stride)[:, :keys]


@functools.lru_cache(maxsize=64)
def _layout(rows: int, d: int, dt, rank: int = 2):
    from triton.experimental.gluon import language as gl
    shape = [rows, d] if rank == 2 else [1, rows, d]
    return gl.NVMMASharedLayout.get_default_for(shape, dt)


def schedule_trace(plan, q, k, v, descales=None):
    """One launch of ``plan`` (a one-tile ping-pong plan, fixed lengths) that records its schedule:
    ``(out, lse, stamps)``, ``stamps`` int64 (programs, NUM_WG, key tiles + 1, TRACE_EVENTS), each
    consumer warpgroup's ``%clock64`` at the events of each critical section
    (``kernels.hopper_fwd_tile._stamp``), -1 where none was taken. ``descales``: e4m3 inputs' (the FP8
    plan's; ``ioattn.fp8.descale_rows``)."""
    from ioattn.kernels.constants import TRACE_EVENTS

    consts = dict(plan.constexprs)
    if not consts.get("PINGPONG") or consts.get("PERSISTENT") or consts.get("IS_VARLEN"):
        raise ValueError(f"the schedule record needs a one-tile ping-pong plan of fixed lengths, got the "
                         f"{plan.variant} variant (PERSISTENT={consts.get('PERSISTENT')}, "
                         f"IS_VARLEN={consts.get('IS_VARLEN')})")
    sections = -(-plan.seqlen_k // plan.block_n) + 1
    stamps = torch.full((plan.programs, consts["NUM_WG"], sections, TRACE_EVENTS), -1, dtype=torch.int64,
                        device=q.device)
    out, lse = ForwardLaunch(plan, q, k, v, cached=False, trace=stamps, out_dtype=torch.bfloat16 if descales is not None
                             else None)(q, k, v, descales=descales)
    return out, lse, stamps
