"""One Gluon backward call per head dim, for Nsight Compute: warm-up calls first, then one profiled
call each, in the order given. Under ``ncu --kernel-name regex:hopper_bwd --launch-skip W`` (W =
warm-up calls x head dims) the profiled launches are the last ones.

    ncu ... python benchmarks/ncu_bwd.py --headdims 128,256 --seqlen 16384 [--causal]

bf16, 16384 tokens in all (batch = 16384 // seqlen), hidden 2048, the ws variant (the dispatch's),
its inputs from the Gluon forward. Prints the number of backward launches before the profiled ones.
"""
import argparse

import torch

import ioattn
from ioattn import hopper
from ioattn.kernels.hopper_backward import hopper_backward

WARMUP = 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="128,256")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    n = args.seqlen
    calls = []
    for d in map(int, args.headdims.split(",")):
        batch, heads = max(1, 16384 // n), 2048 // d
        q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with hopper.prefer_hopper(True), torch.no_grad():
            out, lse = ioattn.flash_attn_func(q, k, v, causal=args.causal, return_attn_probs=True)[:2]
        dout = torch.randn_like(out)
        calls.append(lambda q=q, k=k, v=v, out=out, lse=lse, dout=dout, d=d: hopper_backward(
            dout, q, k, v, out, lse, d ** -0.5, args.causal, variant=hopper.BWD_VARIANT))
    for call in calls:
        for _ in range(WARMUP):
            call()
    torch.cuda.synchronize()
    print(f"warm-up backward launches: {WARMUP * len(calls)}", flush=True)
    for call in calls:
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
