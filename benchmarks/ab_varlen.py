"""A/B of the varlen (packed) forward: the Gluon Hopper kernel's IS_VARLEN specialisation (switched
on here: ``hopper.GLUON_VARLEN``) against the portable Triton kernel, on ragged batches.

    python benchmarks/ab_varlen.py --out DIR [--headdims 64,128] [--means 512,2048]

bf16, hidden 2048, about 16384 tokens a batch: sequence lengths drawn uniformly from [mean / 4,
7 mean / 4] (seed 0) until the total passes 16384. FLOPs: the sum over sequences of the forward's
4 * H * L_q * L_k * D (halved when causal). Each provider's output is checked finite and within
0.05 of the other's (a smoke check: the float64 oracle is the GPU tests' job); timing is
``ioattn.bench.timing.median_ms`` (device time, median of 20). Writes DIR/ab_varlen.jsonl.
"""
import argparse
import json
import os
import random

import torch

import ioattn
from ioattn import hopper
from ioattn.bench.timing import median_ms

TOKENS, HIDDEN = 16384, 2048


def lengths(mean, seed=0):
    rng = random.Random(seed)
    out = []
    while sum(out) < TOKENS:
        out.append(rng.randint(mean // 4, 7 * mean // 4))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--means", default="512,2048")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, "ab_varlen.jsonl"), "w")
    hopper.GLUON_VARLEN = True
    print(f"{'d':>3} {'c':>1} {'mean':>5} {'seqs':>4} {'gluon':>8} {'portable':>8} {'ratio':>6}")
    for d in map(int, args.headdims.split(",")):
        h = HIDDEN // d
        for mean in map(int, args.means.split(",")):
            lens = lengths(mean)
            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
            total = sum(lens)
            q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                flops = sum(4 * h * n * n * d for n in lens) / (2 if causal else 1)
                res, outs = {}, {}
                for name, on in (("gluon", True), ("portable", False)):
                    def run(_, on=on):
                        with hopper.prefer_hopper(on):
                            return ioattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
                    with hopper.prefer_hopper(on):
                        kernel = ioattn.explain_dispatch(q, k, v, causal=causal, cu_seqlens_q=cu,
                                                         max_seqlen_q=max(lens)).forward["kernel"]
                    outs[name] = run(None)
                    ms = median_ms(run, [None])
                    res[name] = flops / ms / 1e9
                    sink.write(json.dumps(dict(headdim=d, causal=causal, mean=mean, seqs=len(lens), tokens=total,
                                               provider=name, kernel=kernel, ms=ms, tflops=res[name])) + "\n")
                    sink.flush()
                ok = all(torch.isfinite(o).all() for o in outs.values()) and \
                    (outs["gluon"].float() - outs["portable"].float()).abs().max().item() < 0.05
                print(f"{d:>3} {int(causal):>1} {mean:>5} {len(lens):>4} {res['gluon']:8.0f} {res['portable']:8.0f} "
                      f"{res['gluon'] / res['portable']:6.2f}{'' if ok else ' MISMATCH'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
