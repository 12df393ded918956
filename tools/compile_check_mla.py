"""Compile the Gluon MLA decode kernel (``ioattn.kernels.hopper_mla``) for sm_90 without a GPU, at the
tiles its plan uses (``ioattn.plan.decode.MLA_*``) and any given: every combination of paged or
contiguous cache, causal or not, split or not, bf16. Per build it prints shared memory, ptxas's
registers and spills and the PTX's wgmma and TMA counts, and asserts that the build fits an H200's
shared memory, does not spill, and issues its products by wgmma (36 k-steps of S over 576 columns,
BLOCK_N / 16 of P V) with TMA loads.

    python tools/compile_check_mla.py [--block-n 64] [--stages 2] [--quick] [--no-ptxas]
"""
import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gluon_aot import H200_SHARED_BYTES, compile_sm90, ptx_counts, ptxas_report  # noqa: E402

INTS = ("stride_ob", "stride_om", "stride_oh", "stride_ps", "stride_pb", "stride_pm", "stride_ph", "stride_ls",
        "stride_lb", "stride_lm", "stride_lh", "stride_btb", "seqlen_base", "seqlen_new", "seqlen_q", "group",
        "capacity", "num_pages")


def build(block_n, stages, paged, causal, split, dv=512, dr=64):
    from triton.experimental.gluon import language as gl

    from ioattn.kernels.hopper_mla import mla_decode_kernel
    from ioattn.plan.decode import MLA_BLOCK_M, MLA_WARPS

    def desc(rows, cols):
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)
        return f"tensordesc<bf16[{rows},{cols}],{layout!r}>"

    sig = dict(q_desc=desc(MLA_BLOCK_M, dv), qr_desc=desc(MLA_BLOCK_M, dr), k_desc=desc(block_n, dv),
               kr_desc=desc(block_n, dr), Out="*bf16", Lse="*fp32", Opart="*fp32", Lpart="*fp32", SeqLens="*i32",
               BlockTable="*i32", qk_scale="fp32", **{n: "i32" for n in INTS})
    consts = dict(BLOCK_N=block_n, STAGES=stages, PAGE_SIZE=64 if paged else 1, PAGED=paged, HAS_SEQLENS=True,
                  IS_CAUSAL=causal, SPLIT=split)
    return compile_sm90(mla_decode_kernel, sig, consts, num_warps=MLA_WARPS)


def check(block_n, stages, paged, causal, split, ptxas=True):
    kernel = build(block_n, stages, paged, causal, split)
    smem = kernel.metadata.shared
    c = ptx_counts(kernel.asm["ptx"])
    where = f"mla block_n={block_n} stages={stages} paged={paged} causal={causal} split={split}"
    line = f"{where} smem={smem} wgmma={c['wgmma']} tma={c['tma']}"
    assert smem <= H200_SHARED_BYTES, (where, smem)
    assert c["wgmma"] == 576 // 16 + block_n // 16 and c["tma"] > 0, (where, c)
    if ptxas:
        regs, spills, _, why = ptxas_report(kernel.asm["ptx"])
        line += f" regs={regs} spill={spills}B"
        assert spills == 0, (where, spills)
    print(line, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-n", type=int, default=None, help="key tile (default: the plan's)")
    ap.add_argument("--stages", type=int, default=None, help="ring depth (default: the plan's)")
    ap.add_argument("--quick", action="store_true", help="paged, split, causal and not: the plan's usual builds")
    ap.add_argument("--no-ptxas", action="store_true")
    args = ap.parse_args()
    from ioattn.plan.decode import MLA_BLOCK_N, MLA_STAGES

    block_n, stages = args.block_n or MLA_BLOCK_N, args.stages or MLA_STAGES
    combos = ([(True, c, True) for c in (False, True)] if args.quick else
              list(itertools.product((False, True), (False, True), (False, True))))
    for paged, causal, split in combos:
        check(block_n, stages, paged, causal, split, ptxas=not args.no_ptxas)
    print("mla kernel compiled for sm_90")


if __name__ == "__main__":
    main()
