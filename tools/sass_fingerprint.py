"""A fingerprint of each Gluon Hopper build's SASS (compiled for sm_90 without a GPU), to show that a
refactor left the measured kernels unchanged: run it before and after, and compare the lines.
Addresses are dropped; the instructions, their operands and their order count.

    python tools/sass_fingerprint.py [--pass fwd|bwd|both|portable|mla|decode-fp8] [--variants persistent]
        [--headdims 64,128]
        [--masks 0,1] [--varlen] [--walk-table default|on|off]

``--variants`` names the forward's variants; the backward fingerprints its dispatched variant (ws).
``--pass portable``: the portable Triton kernels instead (forward through pointers and TMA, the three
backward passes, the decode split kernel and the merge) at their default features and tiles, each
head dim's launch as its launcher passes it. ``--pass mla``: the MLA decode kernel's builds (contiguous
and paged, split and not) at the plan's tiles. ``--pass decode-fp8``: the decode split kernel's 128-key
pointer tile at d = 128 on a bf16 and an e4m3 cache (at the plan's register cap), and on an e4m3 cache
with an fp16 query (uncapped), with their format conversions counted (docs/decisions/fp8-decode.md).
"""
import argparse
import hashlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_check as cc_portable  # noqa: E402
import compile_check_hopper as cc  # noqa: E402
import compile_check_hopper_bwd as cc_bwd  # noqa: E402
import compile_check_mla as cc_mla  # noqa: E402
from gluon_aot import ptxas_report, sass_text  # noqa: E402

from ioattn.plan import hopper  # noqa: E402
from ioattn.plan.decode import MLA_BLOCK_N, MLA_STAGES  # noqa: E402


def fingerprint(kernel) -> tuple:
    """(sha1 of the SASS instructions without their addresses, instruction count)."""
    lines = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip()
             for line in sass_text(kernel.asm["cubin"]).splitlines() if line.strip().startswith("/*")]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12], len(lines)


def _wanted(d, headdims):
    return not headdims or str(d) in headdims.split(",")


def forward(args):
    table = None if args.walk_table == "default" else args.walk_table == "on"
    for variant in args.variants.split(","):
        for d in hopper.TILE_TABLE[variant]:
            if not _wanted(d, args.headdims):
                continue
            for causal in (bool(int(m)) for m in args.masks.split(",")):
                with hopper.walk_table(table):
                    _, kernel = cc.compile_one(variant, d, "bf16", causal, varlen=args.varlen)
                digest, count = fingerprint(kernel)
                print(f"fwd {variant} d={d} causal={causal} varlen={args.varlen} walk_table={args.walk_table}: "
                      f"{digest} ({count} instructions)")


def backward(args):
    for d in cc_bwd.BWD_VARIANT_HEADDIMS["ws"]:
        if not _wanted(d, args.headdims):
            continue
        for causal in (bool(int(m)) for m in args.masks.split(",")):
            _, kernel = cc_bwd.compile_one("ws", d, "bf16", causal, varlen=args.varlen)
            digest, count = fingerprint(kernel)
            print(f"bwd ws d={d} causal={causal} varlen={args.varlen}: {digest} ({count} instructions)")


def _portable_builds(d):
    """(name, kernel, constexprs, warps, stages) of the portable kernels' default launches at head dim ``d``."""
    from ioattn.kernels.backward import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
    from ioattn.kernels.combine import merge_states_kernel
    from ioattn.kernels.decode import decode_split_kernel
    from ioattn.kernels.forward import attn_fwd_kernel
    from ioattn.plan import decode, dispatch

    bd = dispatch.block_d(d)
    dims = dict(HEAD_DIM=d, BLOCK_D=bd, HEAD_DIM_V=d, BLOCK_DV=bd)  # (V's where a kernel takes them)
    plain = dict(IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False)
    for tma in (False, True):
        cfg = dispatch._FWD_TILES_TMA.get(bd, dispatch._FWD_TILES[bd]) if tma else dispatch._FWD_TILES[bd]
        yield (f"fwd tma={tma}", attn_fwd_kernel, dict(dims, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_TMA=tma, **plain),
               cfg.num_warps, cfg.num_stages)
    yield "bwd preprocess", attn_bwd_preprocess_kernel, dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=64, IS_VARLEN=False), 4, 1
    cfg = dispatch._BWD_TILES[bd]
    for name, fn in (("bwd dkdv", attn_bwd_dkdv_kernel), ("bwd dq", attn_bwd_dq_kernel)):
        yield name, fn, dict(dims, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **plain), cfg.num_warps, cfg.num_stages
    for paged, tma in ((False, False), (True, True)):
        yield (f"decode paged={paged} tma={tma}", decode_split_kernel,
               dict(dims, BLOCK_M=16, BLOCK_N=decode._BLOCK_N_CUDA, PAGE_SIZE=64 if paged else 1, PAGED=paged,
                    HAS_BATCH_IDX=False, HAS_LEFTPAD=False, HAS_SOFTCAP=False, HAS_ALIBI=False, USE_TMA=tma,
                    UNIFIED=False, PHI_BELOW=64.0, PHI_ABOVE=64.0, HAS_SEQLENS=True, BLOCK_D_TAIL=0),
               decode._NUM_WARPS, decode._NUM_STAGES)
    yield ("merge", merge_states_kernel, dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_S=32, CHUNK_S=32, LSE_BHM=True), 4, 1)


def portable(args):
    for d in map(int, (args.headdims or "64,128").split(",")):
        for name, fn, constexprs, warps, stages in _portable_builds(d):
            sig_fix = dict(Outs="*fp32", Lses="*fp32") if name == "merge" else None  # the split partials
            constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
            _, _, kernel = cc_portable.compile_one(fn, constexprs, warps, stages, sig_fix=sig_fix)
            digest, count = fingerprint(kernel)
            print(f"portable {name} d={d}: {digest} ({count} instructions)")


def mla(args):
    for paged in (False, True):
        for split in (False, True):
            for causal in (bool(int(m)) for m in args.masks.split(",")):
                kernel = cc_mla.build(MLA_BLOCK_N, MLA_STAGES, paged, causal, split)
                digest, count = fingerprint(kernel)
                print(f"mla paged={paged} split={split} causal={causal}: {digest} ({count} instructions)")


def decode_fp8(args):
    from ioattn.kernels.decode import decode_split_kernel
    from ioattn.plan import decode

    c = dict(HEAD_DIM=128, BLOCK_D=128, HEAD_DIM_V=128, BLOCK_DV=128, BLOCK_M=16, BLOCK_N=decode._BLOCK_N_CUDA,
             PAGE_SIZE=1, PAGED=False, HAS_BATCH_IDX=False, HAS_LEFTPAD=False, HAS_SOFTCAP=False, HAS_ALIBI=False,
             USE_TMA=False, UNIFIED=False, PHI_BELOW=64.0, PHI_ABOVE=64.0, HAS_SEQLENS=True, BLOCK_D_TAIL=0)
    aligned = [n for n in decode_split_kernel.arg_names if n not in c and (n[0].isupper() or n.startswith("stride_")
                                                                            and n[-1] in "bmhnsl")]
    e4m3 = dict(K="*fp8e4nv", V="*fp8e4nv", KDescale="*fp32", VDescale="*fp32")
    for name, q_dtype, fp8, cap in (("bf16 cache", "bf16", False, None),
                                    ("e4m3 cache", "bf16", True, decode.FP8_WIDE_MAX_REGS),
                                    ("e4m3 cache, fp16 q, uncapped", "fp16", True, None)):
        _, _, kernel = cc_portable.compile_one(decode_split_kernel, dict(c, KV_FP8=fp8), decode._NUM_WARPS,
                                                  decode._NUM_STAGES, q_dtype, aligned, e4m3 if fp8 else None, cap)
        sass = sass_text(kernel.asm["cubin"])
        ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+([A-Z0-9_]+)", sass, re.M)
        digest, count = fingerprint(kernel)
        regs, spills = ptxas_report(kernel.asm["ptx"])[:2]
        print(f"decode {name}: {digest} ({count} instructions, F2F {ops.count('F2F')}, PRMT {ops.count('PRMT')}, "
              f"{regs} registers, {spills} bytes spilled)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass", dest="pass_", default="fwd", choices=("fwd", "bwd", "both", "portable", "mla",
                                                                         "decode-fp8"))
    ap.add_argument("--variants", default="persistent")
    ap.add_argument("--headdims", default=None, help="comma-separated subset of each variant's head dims")
    ap.add_argument("--masks", default="0,1")
    ap.add_argument("--varlen", action="store_true", help="the packed-sequence (IS_VARLEN) builds")
    ap.add_argument("--walk-table", default="default", choices=("default", "on", "off"))
    args = ap.parse_args()
    if args.pass_ in ("fwd", "both"):
        forward(args)
    if args.pass_ in ("bwd", "both"):
        backward(args)
    if args.pass_ == "portable":
        portable(args)
    if args.pass_ == "mla":
        mla(args)
    if args.pass_ == "decode-fp8":
        decode_fp8(args)


if __name__ == "__main__":
    main()
