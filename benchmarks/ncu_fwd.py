"""One Gluon forward call per variant, for Nsight Compute: warm-up calls first (compile, caches), then
one profiled call each, in the order given. Under ``ncu --kernel-name regex:hopper_fwd
--launch-skip W`` (W = warm-up calls x variants) the profiled launches are the last ones.

    ncu ... python benchmarks/ncu_fwd.py --variants persistent,pingpong --seqlen 16384 --headdim 128

bf16, 16384 tokens in all (the bench's grid: batch = 16384 // seqlen), hidden 2048, non-causal
unless ``--causal``. ``--deferred-row-sum both``: each variant twice, the row sum's quad reduction
every key tile, then once a tile (``hopper.deferred_row_sum`` off / on; default: the launcher's
policy). Prints the number of kernel launches before the profiled ones. ``--fp8``: the FP8 forward too, after
the variants, on the same inputs quantised per head outside the profiled call (the bench's
``ioattn-fp8``; docs/decisions/fp8-forward.md asks for its stall profile against the bf16 kernel's).
"""
import argparse

import torch

import ioattn
from ioattn.plan import hopper
from ioattn.bench.providers import providers

WARMUP = 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="persistent,pingpong")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cudnn", action="store_true", help="SDPA's cuDNN forward too, after the variants (profile "
                    "with a --kernel-name regex that also matches its kernel, e.g. 'hopper_fwd|sdpa|fprop|fmha')")
    ap.add_argument("--fp8", action="store_true", help="the FP8 forward (per-head descales) after the variants")
    ap.add_argument("--deferred-row-sum", default="default", choices=("default", "on", "off", "both"))
    args = ap.parse_args()
    n, d = args.seqlen, args.headdim
    batch, heads = max(1, 16384 // n), 2048 // d
    q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    names = args.variants.split(",") if args.variants else []
    row_sums = {"default": [None], "on": [True], "off": [False], "both": [False, True]}[args.deferred_row_sum]
    cudnn = providers(["sdpa-cudnn"])["sdpa-cudnn"][0] if args.cudnn else None
    fp8 = providers(["ioattn-fp8"])["ioattn-fp8"][0] if args.fp8 else None
    for phase in ("warm", "profiled"):
        for name in names:
            for row_sum in row_sums:
                with hopper.prefer_hopper(True), hopper.variant(name), hopper.deferred_row_sum(row_sum):
                    for _ in range(WARMUP if phase == "warm" else 1):
                        ioattn.flash_attn_func(q, k, v, causal=args.causal)
        for _ in range((WARMUP if phase == "warm" else 1) if fp8 else 0):
            fp8(q, k, v, args.causal)
        for _ in range((WARMUP if phase == "warm" else 1) if cudnn else 0):
            cudnn(q, k, v, args.causal)
        torch.cuda.synchronize()
        if phase == "warm":
            print(f"warm-up launches: {WARMUP * (len(names) * len(row_sums) + bool(fp8) + bool(cudnn))}", flush=True)


if __name__ == "__main__":
    main()
