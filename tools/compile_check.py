"""Compile the Triton kernels for sm_90 without a GPU (Triton's ahead-of-time path), so compile
errors show up on a development machine instead of costing device time. Also prints each kernel's
register count, spills and shared memory.

    python tools/compile_check.py [--headdims 64,128] [--quick] [--rescale-tau 8]
"""
import argparse
import inspect
import itertools

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ioattn.plan import dispatch
from ioattn.kernels.backward import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
from ioattn.kernels.forward import attn_fwd_kernel

H200_SHARED_BYTES = 232448  # the per-block limit Triton reported on the device
FLOAT_ARGS = {"qk_scale", "softcap", "softmax_scale", "dropout_scale", "phi"}
# pointers whose element type is not the inputs' dtype
POINTER_TYPES = {"Lse": "*fp32", "Delta": "*fp32", "alibi_slopes": "*fp32", "Opart": "*fp32", "Lpart": "*fp32",
                 "SeqLens": "*i32", "Leftpad": "*i32", "BlockTable": "*i32", "CacheBatchIdx": "*i32"}
I64_ARGS = {"seed", "dropout_threshold"}
# tuples of a call's mask / score functions and block mask (ioattn.modcall): None, as the launchers pass them
# without one
NONE_ARGS = ("mods", "blocks")


def signature(fn, dtype):
    sig = {}
    for name in fn.arg_names:
        if name in POINTER_TYPES:
            sig[name] = POINTER_TYPES[name]
        elif name.startswith("cu_seqlens"):
            sig[name] = "*i32"
        elif name[0].isupper() or name[:2] in ("dO", "dK", "dV", "dQ"):
            sig[name] = "*" + dtype
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        elif name in I64_ARGS:
            sig[name] = "i64"
        else:
            sig[name] = "i32"
    return sig


def compile_one(fn, constexprs, num_warps, num_stages, dtype="bf16", divisible=(), sig_fix=None, maxnreg=None):
    """``divisible``: argument names given the divisibility-by-16 hint the JIT attaches to aligned
    pointers and to integers that are multiples of 16 (without it the loads are not pipelined, so
    shared memory and registers differ from the device's compile). ``sig_fix``: argument types that
    differ from ``signature``'s guess. ``maxnreg``: the launch's register cap, if any."""
    sig = {**signature(fn, dtype), **(sig_fix or {})}
    # constexpr parameters the caller leaves out take their defaults (not runtime arguments)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    constexprs = {**defaults, **{n: None for n in NONE_ARGS if n in fn.arg_names}, **constexprs}
    if "k_desc" in fn.arg_names:
        if constexprs.get("USE_TMA"):
            block = f"[1,{constexprs['BLOCK_N']},1,{constexprs['BLOCK_D']}]"
            sig["k_desc"] = sig["v_desc"] = f"tensordesc<{dtype}{block}>"
        else:
            constexprs.update(k_desc=None, v_desc=None)
    for k in constexprs:
        sig[k] = "constexpr"
    # hints on runtime arguments only: a constexpr has no IR argument (Triton 3.6 drops a hint given to
    # one; from 3.7 on it lands on the IR argument at the cursor, or past the last one)
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible if n not in constexprs}
    src = ASTSource(fn, sig, constexprs, attrs or None)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages,
                                    **({"maxnreg": maxnreg} if maxnreg else {})))
    md = k.metadata
    return k.n_regs if hasattr(k, "n_regs") else None, getattr(md, "shared", None), k


def _jit_type(value):
    """The signature type the JIT gives a launch argument: a tensor's pointer, an int, a float, a tuple of them."""
    import torch

    if isinstance(value, tuple):
        return tuple(_jit_type(v) for v in value)
    if isinstance(value, torch.Tensor):
        return "*" + {torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64", torch.bfloat16: "bf16",
                      torch.float16: "fp16", torch.bool: "i1"}[value.dtype]
    return "fp32" if isinstance(value, float) else "i32"


def compile_mods(d=64):
    """The portable forward, dK / dV and dQ kernels with a score function capturing a learnable table, a
    mask function capturing document ids and a block mask's lists (``ioattn.modcall.ModCall``'s
    arguments, typed as the JIT types them); returns one report line a kernel."""
    import torch

    from ioattn import mods
    from ioattn.block_mask import create_block_mask
    from ioattn.modcall import ModCall

    table = torch.zeros(4, 9, requires_grad=True)
    docs = torch.zeros(256, dtype=torch.int32)
    call = ModCall.make(mods.relative_bias(table), None,
                        create_block_mask(mods.document_mask(docs, mods.causal_mask), None, None, 256, 256,
                                          BLOCK_SIZE=128))
    bd = dispatch.block_d(d)
    lines = []
    for fn, cfg, extra in ((attn_fwd_kernel, dispatch._FWD_TILES[bd], dict(USE_TMA=False)),
                           (attn_bwd_dkdv_kernel, dispatch._BWD_TILES[bd], {}),
                           (attn_bwd_dq_kernel, dispatch._BWD_TILES[bd], {})):
        cfg = call.fit_tiles(cfg)
        if fn is attn_fwd_kernel:
            kw = call.forward_kwargs(1.0, cfg)
        else:
            kw = call.backward_kwargs(1.0, cfg, (torch.zeros(4, 9),))[0 if fn is attn_bwd_dkdv_kernel else 1]
        sig = signature(fn, "bf16")
        sig["mods"], sig["blocks"] = _jit_type(kw["mods"]), _jit_type(kw["blocks"])
        consts = dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_VARLEN=False,
                      HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False, **extra,
                      **{k: v for k, v in kw.items() if k not in ("mods", "blocks")})
        src = ASTSource(fn, {**sig, **{k: "constexpr" for k in consts}, "k_desc": "constexpr", "v_desc": "constexpr"}
                        if fn is attn_fwd_kernel else {**sig, **{k: "constexpr" for k in consts}},
                        {**{p.name: p.default for p in fn.params if p.is_constexpr
                            and p.default is not inspect.Parameter.empty}, **consts,
                         **({"k_desc": None, "v_desc": None} if fn is attn_fwd_kernel else {})})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        lines.append(f"{fn.__name__:<24} d={d} mods tiles={cfg.block_m}x{cfg.block_n} shared={k.metadata.shared} "
                     f"atomics={k.asm['ptx'].count('atom.')}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="16,59,64,128,256")
    ap.add_argument("--quick", action="store_true", help="only the default feature set")
    ap.add_argument("--rescale-tau", type=float, default=0.0,
                    help="the forward's RESCALE_TAU (conditional rescaling threshold; 0 = off)")
    ap.add_argument("--dump", default=None, help="write the forward's TTGIR and PTX (default features) here")
    ap.add_argument("--mods", action="store_true",
                    help="only the kernels with a score function, a mask function and a block mask")
    args = ap.parse_args()
    if args.mods:
        for line in compile_mods():
            print(line)
        print("all kernels compiled for sm_90")
        return
    features = [dict(IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False)]
    if not args.quick:
        features += [dict(IS_VARLEN=v, HAS_SOFTCAP=s, HAS_ALIBI=a, HAS_DROPOUT=d)
                     for v, s, a, d in itertools.product([True], [True], [True], [True])]
    for d in map(int, args.headdims.split(",")):
        bd = dispatch.block_d(d)
        for feat in features:
            for kind, fns in (("fwd", [attn_fwd_kernel]), ("bwd", [attn_bwd_dkdv_kernel, attn_bwd_dq_kernel])):
                cfg = dispatch._FWD_TILES[bd] if kind == "fwd" else dispatch._BWD_TILES[bd]
                for fn in fns:
                    for tma in ((False, True) if fn is attn_fwd_kernel and d % 8 == 0 else (False,)):
                        if fn is attn_fwd_kernel and tma:
                            cfg = dispatch._FWD_TILES_TMA.get(bd, dispatch._FWD_TILES[bd])
                        c = dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **feat)
                        if fn is attn_fwd_kernel:
                            c["USE_TMA"] = tma
                            c["RESCALE_TAU"] = args.rescale_tau
                        _, shared, k = compile_one(fn, c, cfg.num_warps, cfg.num_stages)
                        pipelined = k.asm["ttgir"].count("async_")
                        if args.dump and fn is attn_fwd_kernel and feat is features[0]:
                            for ext in ("ttgir", "ptx"):
                                with open(f"{args.dump}/fwd_d{d}_tma{int(tma)}.{ext}", "w") as fh:
                                    fh.write(k.asm[ext])
                        # must fit the chip; say when the tile is too small for Hopper's wgmma
                        # (M < 64 per warpgroup falls back to mma.sync, a slower path)
                        assert shared <= H200_SHARED_BYTES, f"{fn.__name__} d={d}: {shared} B shared"
                        mma_kind = "wgmma" if "wgmma" in k.asm["ptx"] else "mma.sync (no wgmma)"
                        tau = f" tau={args.rescale_tau:g}" if fn is attn_fwd_kernel and args.rescale_tau else ""
                        print(f"{fn.__name__:<24} d={d:<3} {cfg} {feat} tma={tma}{tau} shared={shared} "
                              f"async_ops={pipelined} {mma_kind}")
        _, shared, _ = compile_one(attn_bwd_preprocess_kernel, dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=64,
                                                                    IS_VARLEN=False), 4, 1)
    print("all kernels compiled for sm_90")


if __name__ == "__main__":
    main()
