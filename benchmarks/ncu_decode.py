"""One decode step per provider, for Nsight Compute: the call set up as ``ioattn bench decode`` sets
it up (bf16, 32 query / 8 KV heads, d = 128, full caches), warm-up calls first, then one call per
provider inside the NVTX range ``prof`` (push/pop), so that

    ncu --nvtx --nvtx-include "prof/" ... python benchmarks/ncu_decode.py --batch 64 --kvlen 4096

profiles every kernel of the profiled calls and nothing else, whatever each provider launches.
The question (docs/decisions/decode-one-wave.md): at batch 64 x 4096 cuDNN streams the cache ~1 % faster than our split
kernel in a full wave; its grid, block, registers, shared memory and DRAM / L2 figures against ours.
``--mla``: MLA's shape instead (``ioattn bench mla``'s: 128 query heads over one latent KV head, 576 / 512),
for the stall profile of the Gluon MLA kernel (docs/decisions/mla-decode-kernel.md; ``ioattn-split``: the
split kernel).
"""
import argparse

import torch

from ioattn.bench.providers import decode_providers
from ioattn.bench.run import DecodeShape, _decode_inputs

WARMUP = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kvlen", type=int, default=4096)
    ap.add_argument("--providers", default="ioattn,sdpa-cudnn")
    ap.add_argument("--mla", action="store_true", help="MLA's shape: 128 query heads, one latent KV head, 576 / 512")
    args = ap.parse_args()
    names = args.providers.split(",")
    table = decode_providers(names)
    shape = (DecodeShape(args.batch, args.kvlen, 128, 1, 576, 512, True) if args.mla else
             DecodeShape(args.batch, args.kvlen, 32, 8, 128))
    inputs = _decode_inputs(shape, torch.bfloat16, "cuda")
    calls = {}
    for name in names:
        setup, reason = table[name]
        if setup is None:
            raise SystemExit(f"{name}: {reason}")
        calls[name] = setup(*inputs)
    with torch.no_grad():
        for name, call in calls.items():
            for _ in range(WARMUP):
                call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")  # one flat range (the providers' kernels in the order given)
        for call in calls.values():
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    print("profiled:", ", ".join(names), flush=True)


if __name__ == "__main__":
    main()
