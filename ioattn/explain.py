"""``explain_dispatch``: which implementation, kernel, tiles and load path a call would use, without
running it. The same host policy the launchers call (``ioattn.plan.dispatch``); for the Gluon kernels the
plan objects the launches carry out (``forward["plan"]``, ``backward["plan"]``), so what it says is
what runs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ioattn import _compat, backends, fp8
from ioattn.plan import dispatch, hopper, hopper_bwd
from ioattn.plan import backward as backward_plan
from ioattn.plan import forward as forward_plan
from ioattn.plan import mods as mods_plan
from ioattn.masks import normalize_window
from ioattn.modcall import ModCall
from ioattn.semantics import Semantics


@dataclass(frozen=True)
class DispatchPlan:
    backend: str            # "triton" (CUDA, or the interpreter), "reference" (tiled PyTorch) or "refused"
                            # (an interpreted call the interpreter would compute wrongly: the call raises)
    reason: str
    forward: dict | None    # kernel, tiles (block_m, block_n, warps, stages), kv_loads, programs; Gluon: exp2_fma, cond_rescale
    backward: dict | None

    def describe(self) -> str:
        lines = [f"backend: {self.backend} ({self.reason})"]
        for name, part in (("forward", self.forward), ("backward", self.backward)):
            if part:
                lines.append(f"{name}: " + ", ".join(f"{k}={v}" for k, v in part.items()))
        return "\n".join(lines)


def explain_dispatch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     window_size=(-1, -1), cu_seqlens_q: torch.Tensor | None = None,
                     max_seqlen_q: int | None = None, softcap: float = 0.0,
                     alibi_slopes: torch.Tensor | None = None, mask_mod=None, score_mod=None,
                     block_mask=None) -> DispatchPlan:
    """The plan for ``flash_attn_func(q, k, v, causal=..., window_size=..., softcap=...,
    alibi_slopes=..., mask_mod=..., score_mod=..., block_mask=...)`` (or the varlen call when
    ``cu_seqlens_q``/``max_seqlen_q`` are given, with q/k/v packed as (total, nheads, d))."""
    varlen = cu_seqlens_q is not None
    call = ModCall.make(score_mod, mask_mod, block_mask)
    if call is not None:
        seqlen = max_seqlen_q if varlen else q.shape[1]
        form = None
        if window_size in ((-1, -1), [-1, -1]) and not causal and softcap == 0 and alibi_slopes is None:
            form = call.builtin(seqlen, seqlen if varlen else k.shape[1], varlen)
        if form is not None:  # library functions with a built-in form: the built-in call's plan
            plan = explain_dispatch(q, k, v, False, form["window"], cu_seqlens_q, max_seqlen_q, form["softcap"],
                                    form["alibi_slopes"])
            note = "library functions with a built-in form: run as window_size / softcap / alibi_slopes"
            return DispatchPlan(plan.backend, plan.reason, dict(plan.forward or {}, mods=note),
                                dict(plan.backward or {}, mods=note))
        return _mods_plan(q, k, v, call, varlen, normalize_window(window_size, bool(causal)),
                          max_seqlen_q if varlen else q.shape[1], cu_seqlens_q)
    if not dispatch.use_triton(q.device):
        from ioattn.kernels import cpu
        window = normalize_window(window_size, bool(causal))
        seqlen_q = max_seqlen_q if varlen else q.shape[1]
        part = cpu.plan(seqlen_q, seqlen_q if varlen else k.shape[1], window, softcap, alibi_slopes is not None,
                        device_type=q.device.type, value_dim_differs=v.shape[-1] != q.shape[-1])
        if fp8.is_fp8(q):
            part = dict(part, fp8="dequantised to float32 first (P not rounded to e4m3)")
            return DispatchPlan("reference", f"{q.device.type} tensors without TRITON_INTERPRET=1: the CPU path "
                                "(ioattn.kernels.cpu)", part, _FP8_BACKWARD)
        return DispatchPlan("reference", f"{q.device.type} tensors without TRITON_INTERPRET=1: the CPU path "
                            "(ioattn.kernels.cpu)", part, part)
    reason = "CUDA tensors" if q.is_cuda else "TRITON_INTERPRET=1"
    if dispatch._forced_backend == "triton":
        reason = "forced (dispatch.forced_backend)"
    if dispatch.interpreting(q.device):
        try:
            _compat.check_interpreter(q.dtype)
        except _compat.InterpreterUnsupportedError as e:
            return DispatchPlan("refused", str(e), None, None)
    window = normalize_window(window_size, bool(causal))
    seqlen_q = max_seqlen_q if varlen else q.shape[1]
    if fp8.is_fp8(q):
        return DispatchPlan("triton", reason, _fp8_forward(q, k, v, varlen, window, seqlen_q, cu_seqlens_q, softcap,
                                                          alibi_slopes), _FP8_BACKWARD)
    alibi = hopper.alibi_call_form(alibi_slopes, q.shape[-1], window, varlen, seqlen_q, softcap)
    sem = Semantics(q.shape[-1] ** -0.5, window, softcap, 0.0, alibi_slopes is not None)
    ok, refusal = hopper.hopper_supports(q, k, v, varlen, sem, alibi_slopes)
    taken, why = hopper.fwd_plan(q, k, v, varlen, sem, alibi_slopes, seqlen_q)
    gluon = f"taken ({why})" if taken else f"not taken ({why})" if ok else f"not applicable ({refusal})"
    plan = None
    if taken:
        # the plan the launch carries out (``backends.gluon_forward_route``), at the default softmax scale
        plan = forward_plan.plan_forward(backends.forward_signature(
            q, k, sem.softmax_scale, sem.causal, cu_seqlens_q, seqlen_q, seqlen_q if varlen else None,
            sem.band_window, softcap, alibi_slopes))
        forward = _gluon_forward(plan, q, k, v, varlen, sem, seqlen_q, alibi)
    else:
        forward = _portable_forward(q, k, v, varlen, window, seqlen_q, cu_seqlens_q)
    forward["gluon_hopper"] = gluon
    gluon_ok, gluon_why = _compat.gluon_status()
    if not gluon_ok and gluon_why not in gluon:  # on any device: this Triton's Gluon is not the kernels'
        forward["gluon_api"] = f"off ({gluon_why})"
    if plan is not None:
        forward["tiles_count"], forward["programs"], forward["plan"] = plan.num_tiles, plan.programs, plan
    gluon_bwd, bwd_why = hopper_bwd.bwd_plan(q, k, v, varlen, sem, alibi_slopes, seqlen_q)
    if gluon_bwd:
        # the plan the launch carries out (``backends.gluon_backward_route``), at the default softmax scale
        bplan = backward_plan.plan_backward(backends.backward_signature(
            q, k, sem.softmax_scale, sem.causal, hopper_bwd.bwd_deterministic.wanted(), cu_seqlens_q, seqlen_q,
            seqlen_q if varlen else None, sem.band_window, softcap, sem.alibi))
        backward = _gluon_backward(bplan, q, k, v, varlen, sem, alibi)
    else:
        bwd = dispatch.tiles("bwd", q.shape[-1], q.device, headdim_v=_value_dims(q, v))
        backward = {"kernels": "attn_bwd_preprocess_kernel, attn_bwd_dkdv_kernel, attn_bwd_dq_kernel",
                    "tiles": (bwd.block_m, bwd.block_n, bwd.num_warps, bwd.num_stages), "atomics": False}
    backward["gluon_hopper"] = f"taken ({bwd_why})" if gluon_bwd else f"not taken ({bwd_why})"
    return DispatchPlan("triton", reason, forward, backward)


_FP8_BACKWARD = {"refused": "FP8 inputs have no backward (FP8 attention is for inference)"}


def _mods_plan(q, k, v, call, varlen, window, seqlen_q, cu_seqlens_q) -> DispatchPlan:
    """A call with score / mask functions or a block mask: the portable kernels with the functions
    compiled in (``ioattn.modcall``), or the CPU path's dense bands."""
    what = {}
    if call.score is not None:
        what["score_mod"] = f"{call.score.name} ({len(call.score.captures)} captured tensors, "\
                            f"{len(call.score.grad_captures)} with gradients)"
    if call.mask is not None:
        what["mask_mod"] = call.mask.name
    bm = call.block_mask
    if bm is not None:
        what["block_mask"] = (f"{bm.sparsity():.1f}% of the {bm.kv_indices.numel()} blocks skipped; "
                              f"{int(bm.kv_num_blocks.sum())} partial (the mask function runs), "
                              f"{int(bm.full_kv_num_blocks.sum())} full; blocks {bm.block_size[0]} x "
                              f"{bm.block_size[1]}")
    if not dispatch.use_triton(q.device):
        part = dict(what, path="ioattn.kernels.cpu_mods: dense scores a band of query rows at a time")
        return DispatchPlan("reference", f"{q.device.type} tensors without TRITON_INTERPRET=1: the CPU path", part,
                            dict(part))
    taken, why = mods_plan.fwd_plan(q, k, v, varlen, Semantics(q.shape[-1] ** -0.5, window), call.block_size(),
                                    call.captures(), call.exact_lists())
    if taken:
        plan = forward_plan.plan_forward_mods(backends.forward_signature(q, k, q.shape[-1] ** -0.5, False),
                                              call.score is not None, call.block_size(), call.captures(),
                                              call.exact_lists())
        forward = {"kernel": "ioattn.kernels.hopper_forward.hopper_fwd_kernel (Gluon, pingpong, the functions "
                             "compiled in)",
                   "tiles": (plan.block_m, plan.block_n, 4 * (plan.block_m // 64), dict(plan.constexprs)["STAGES"]),
                   "tiles_count": plan.num_tiles, "programs": plan.programs, "plan": plan}
        block_n, q_block = plan.block_n, dict(plan.constexprs)["Q_BLOCK"]
    else:
        q_block = 0
        forward = _portable_forward(q, k, v, varlen, window, seqlen_q, cu_seqlens_q)
        cfg = call.fit_tiles(dispatch.TileConfig(*forward["tiles"]))
        forward["tiles"] = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
        block_n = cfg.block_n
    forward.update(what, gluon_hopper=f"taken ({why})" if taken else f"not taken ({why})")
    if bm is not None:
        forward["key_walk"] = (f"the listed key blocks only, each as {bm.block_size[1] // block_n} tiles of "
                               f"{block_n} keys" + (f"; the lists regrouped into blocks of {q_block} queries"
                                                    if q_block and q_block != bm.block_size[0] else ""))
    sem = Semantics(q.shape[-1] ** -0.5, window)
    taken, why = mods_plan.bwd_plan(q, k, v, varlen, sem, call.block_size(), bool(call.grad_captures()),
                                    call.heads_share_lists())
    if taken:
        plan = backward_plan.plan_backward_mods(backends.backward_signature(q, k, q.shape[-1] ** -0.5, False),
                                                call.block_size(), call.score is not None)
        backward = dict(what, kernels="ioattn.kernels.hopper_backward_ws.hopper_bwd_ws_kernel (Gluon, ws, the "
                                      "functions compiled in)",
                        tiles=(plan.block_m, plan.block_n, plan.consumer_warps, dict(plan.constexprs)["STAGES"]),
                        atomics=True, plan=plan, gluon_hopper=f"taken ({why})")
    else:
        bwd = call.fit_tiles(dispatch.tiles("bwd", q.shape[-1], q.device))
        backward = dict(what, kernels="attn_bwd_preprocess_kernel, attn_bwd_dkdv_kernel, attn_bwd_dq_kernel",
                        tiles=(bwd.block_m, bwd.block_n, bwd.num_warps, bwd.num_stages),
                        atomics=bool(call.grad_captures()) and "the captured tensors' gradients (dK / dV pass)",
                        gluon_hopper=f"not taken ({why})")
    return DispatchPlan("triton", "CUDA tensors" if q.is_cuda else "TRITON_INTERPRET=1", forward, backward)


def _fp8_forward(q, k, v, varlen, window, seqlen_q, cu_seqlens_q, softcap, alibi_slopes) -> dict:
    """The FP8 forward's part of the plan: the Gluon ping-pong kernel where ``hopper.fp8_fwd_plan`` takes the
    call, else the portable kernel."""
    sem = Semantics(q.shape[-1] ** -0.5, window, softcap, 0.0, alibi_slopes is not None)
    taken, why = hopper.fp8_fwd_plan(q, k, v, varlen, sem, alibi_slopes)
    if not taken:
        forward = _portable_forward(q, k, v, varlen, window, seqlen_q, cu_seqlens_q)
        forward["fp8"] = "e4m3 Q, K, V scaled by their descales; P times P_SCALE through e4m3; fp32 accumulation"
        forward["gluon_hopper"] = f"not taken ({why})"
        return forward
    # (packed sequences: the keys' longest taken as the queries', which explain_dispatch is given)
    plan = forward_plan.plan_forward(backends.forward_signature(
        q, k, sem.softmax_scale, sem.causal, cu_seqlens_q, seqlen_q, seqlen_q if varlen else None, sem.band_window,
        softcap, alibi_slopes))
    return {"kernel": "ioattn.kernels.hopper_forward.hopper_fwd_kernel (Gluon, pingpong, FP8)",
            "tiles": (plan.block_m, plan.block_n, 4 * (plan.block_m // 64), dict(plan.constexprs)["STAGES"]),
            "fp8": ("e4m3 Q, K by TMA; V transposed once a call (keys contiguous, as 8-bit wgmma reads B); P times "
                    "P_SCALE through shared memory; the descales read by the kernel"),
            "gluon_hopper": f"taken ({why})", "tiles_count": plan.num_tiles, "programs": plan.programs, "plan": plan}


def _portable_forward(q, k, v, varlen, window, seqlen_q, cu_seqlens_q) -> dict:
    """The portable forward's part of the plan: its kernel, tiles, loads and grid."""
    d = q.shape[-1]
    tma = dispatch.fwd_uses_tma(k, v, varlen)
    fwd = dispatch.tiles("fwd", d, q.device, seqlen_q=seqlen_q, masked_right=window[1] >= 0, tma=tma,
                         band=sum(window) + 1 if min(window) >= 0 else None, headdim_v=_value_dims(q, v))
    batch = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
    tiles = dispatch.cdiv(seqlen_q, fwd.block_m) * batch * q.shape[-2]
    part = {"kernel": "ioattn.kernels.forward.attn_fwd_kernel",
            "tiles": (fwd.block_m, fwd.block_n, fwd.num_warps, fwd.num_stages),
            "kv_loads": "tma" if tma else "pointer", "head_dim_padded": dispatch.block_d(d),
            "tiles_count": tiles, "programs": tiles}
    if _value_dims(q, v):
        part["value_head_dim_padded"] = dispatch.block_d(v.shape[-1])
    return part


def _value_dims(q, v):
    """V's head dim where it differs from q's and k's (``dispatch.tiles``' ``headdim_v``), else None."""
    return v.shape[-1] if v.shape[-1] != q.shape[-1] else None


_OUT_STORES = {0: "pointer stores from the accumulator layout",
               1: "whole-row pointer stores (Triton's layout conversion)",
               2: "whole-row pointer stores (staged in the Q buffer)",
               3: "TMA bulk copies (staged in the Q buffer)"}


def _gluon_forward(plan, q, k, v, varlen, sem, seqlen_q, alibi) -> dict:
    """The Gluon forward's part of the plan, read from ``plan`` (``plan.forward.GluonForwardPlan``)."""
    name, kd, bm, bn = plan.variant, plan.head_dim, plan.block_m, plan.block_n
    flags = dict(plan.constexprs)  # the lean softmax's options among them
    share = hopper.exp2_fma_share()
    unmasked = not varlen and not sem.sliding and not hopper.key_masks(kd, name, sem.causal, k.shape[1] % bn != 0,
                                                                      k.shape[1])
    forward = {"kernel": f"ioattn.kernels.hopper_forward.hopper_fwd_kernel (Gluon, {name})",
               "tiles": (bm, bn, 4 * (bm // 64), flags["STAGES"]), "kv_loads": "tma (producer warp)",
               "head_dim_padded": kd,
               "inputs": (hopper.padded_inputs_note(q.shape[-1]) if kd != q.shape[-1]
                          else hopper.inputs_note(q, k, v, varlen, sem.causal)),
               "exp2_fma": (f"{share:g}% ({hopper.exp2_fma_cols(share, bn)} of {bn} key columns on the FMA units)"
                            if share else "off (MUFU.EX2 only)"),
               "cond_rescale": (("by warp" if flags["RESCALE_BY_WARP"] else "by thread")
                                + " (the accumulator's rescale skipped unless a row max grows by > 8, log2)"
                                if flags["COND_RESCALE"] else "off"),
               "q_operand": "registers (loaded once a query tile)" if flags["Q_IN_REGS"] else "shared memory",
               "row_sum": ("per-thread partial sums, reduced once a query tile" if flags["DEFERRED_SUM"]
                           else "reduced every key tile"),
               "mask": ("none: the unmasked softmax body alone (no causal mask, every key tile inside the "
                        "sequence)" if unmasked
                        else "a tile's first key step: under its own branch, ahead of one softmax body"
                        if flags["MASK_BRANCH"] else "masked and unmasked softmax bodies"),
               "barriers": ("the consumers' redundant partition barriers dropped from the PTX "
                            "(ioattn.kernels.ptx_barriers)" if flags["PTX_BARRIERS"] else "as Triton emits them"),
               "out_stores": _OUT_STORES[hopper.row_stores(kd, name)]}
    if sem.sliding:
        forward["window"] = (f"{sem.window}: each query tile walks the key tiles its rows' band reaches, those "
                             "a window edge crosses masked")
    if sem.softcap > 0:
        forward["softcap"] = f"{sem.softcap:g} * tanh(s * scale / {sem.softcap:g}) (tanh.approx, before the masks)"
    if alibi:
        form = {hopper.ALIBI_MAGIC: "the distance by a magic-number conversion",
                hopper.ALIBI_FP32_COLS: "the key columns held as fp32"}[alibi]
        forward["alibi"] = ("-slope * |i + seqlen_k - seqlen_q - j| on each score tile (after a softcap, before "
                            f"the masks; {form})")
    if name == "persistent":
        forward.update(_persistent_walk(kd, sem.causal, seqlen_q, bm))
    return forward


def _persistent_walk(kd, causal, seqlen_q, bm) -> dict:
    """The persistent variant's walk, Q buffers, tile index and diagonal."""
    num_m = dispatch.cdiv(seqlen_q, bm)
    opts = hopper.persistent_options(kd, "persistent", causal, num_m)
    part = {"walk": ("a host-built table (gluon_fwd.build_walk_table): longest tiles first within groups "
                     "of heads whose K / V fit in L2, each to the program that frees first"
                     if hopper.walk_table_for(kd, "persistent", causal, num_m) else
                     "pairs of query blocks, head by head" if opts["PAIRED"] else
                     "longest tiles first over the grid" if causal else "head by head"),
            "q_buffers": opts["Q_BUFS"],
            "tile_index": "multiply-high (magic divisors)" if opts["FAST_DIV"] else "integer divisions"}
    if causal:
        part["diagonal"] = ("trimmed: warpgroup 0 computes only the key tiles its rows see (a last tile past "
                            "its rows' diagonal skipped)" if hopper.diag_trim_for(kd, "persistent", True, seqlen_q)
                            else "every warpgroup to its tile's last row's diagonal")
    return part


def _gluon_backward(bplan, q, k, v, varlen, sem, alibi) -> dict:
    """The Gluon backward's part of the plan, read from ``bplan`` (``plan.backward.GluonBackwardPlan``)."""
    d, flags = q.shape[-1], dict(bplan.constexprs)
    backward = {"kernels": "ioattn.kernels.hopper_backward_ws.hopper_bwd_ws_kernel (Gluon, ws)",
                "tiles": (bplan.block_m, bplan.block_n, bplan.num_warps, flags["STAGES"]), "atomics": True,
                "inputs": (hopper.padded_inputs_note(d, backward=True) if bplan.head_dim != d else
                           hopper.inputs_note(q, k, v, varlen, sem.causal, backward=True))}
    if sem.softcap > 0:
        backward["softcap"] = ("SOFTCAP form, dS^T times 1 - tanh^2 ("
                               + ("column split" if flags["COL_SPLIT"] else "key split")
                               + f", {bplan.block_m} query rows a step)")
    if alibi:
        backward["alibi"] = f"ALIBI form, the bias on the recomputed scores ({bplan.block_m} query rows a step)"
    backward["plan"] = bplan
    return backward
