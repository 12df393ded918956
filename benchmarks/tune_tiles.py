"""Tile-size sweep for the Triton kernels on the device: every candidate is checked against the
float64 oracle at a small shape, then timed at the papers' shapes (16k tokens, hidden 2048, bf16).
Writes one JSON line per (kernel, headdim, causal, seqlen, config). The chosen tables live in
ioattn/plan/dispatch.py, with a pointer to the committed output of this script.

    python benchmarks/tune_tiles.py --out DIR [--headdims 64,128,256] [--seqlens 4096,16384]
"""
import argparse
import json
import os

import torch

import ioattn
from ioattn.plan import dispatch
from ioattn.bench.timing import attention_flops, median_ms
from ioattn.reference import attention_ref

# (block_m, block_n, num_warps, num_stages) per padded head dim. The first sweep (all dims, the
# union of these lists) is in benchmarks/results/tune-1; later sweeps narrowed the lists around
# the winners.
FWD_CANDIDATES = {
    64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 4, 2), (256, 64, 8, 3), (128, 128, 4, 2)],
    128: [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3)],
    256: [(64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 8, 2), (64, 32, 4, 4)],
}
BWD_CANDIDATES = {
    64: [(64, 64, 4, 2), (64, 64, 8, 2), (32, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 128, 8, 2)],
    128: [(64, 64, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 128, 8, 2)],
    256: [(32, 64, 4, 1), (32, 64, 8, 1), (64, 64, 8, 1), (32, 32, 4, 2), (16, 64, 4, 1)],
}

def ok_small(d, causal):
    q, k, v = (torch.randn(1, 300, 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = ioattn.flash_attn_func(q, k, v, causal=causal)
    g = torch.autograd.grad(out, (q, k, v), torch.ones_like(out) * 0.1 + torch.randn_like(out))
    ref, _ = attention_ref(q.detach(), k.detach(), v.detach(), window=(-1, 0) if causal else (-1, -1))
    return (out.double() - ref).abs().max().item() < 0.05 and all(torch.isfinite(x).all() for x in g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--kinds", default="fwd,bwd")
    ap.add_argument("--candidates", default=None,
                    help="override the lists: 'bm,bn,warps,stages;...' for every kind and head dim")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "tune_tiles.jsonl"), "w")
    best = {}
    for kind in args.kinds.split(","):
        table = FWD_CANDIDATES if kind == "fwd" else BWD_CANDIDATES
        for d in map(int, args.headdims.split(",")):
            cands = table[dispatch.block_d(d)]
            if args.candidates:
                cands = [tuple(int(x) for x in c.split(",")) for c in args.candidates.split(";")]
            for causal in (False, True):
                for n in map(int, args.seqlens.split(",")):
                    b, h = 16384 // n, 2048 // d
                    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    for cfg in cands:
                        tc = dispatch.TileConfig(*cfg)
                        dispatch.set_tile_override(kind, tc)
                        rec = dict(kind=kind, headdim=d, causal=causal, seqlen=n, config=cfg)
                        try:
                            if not ok_small(d, causal):
                                raise RuntimeError("wrong result")
                            if kind == "fwd":
                                with torch.no_grad():
                                    ms = median_ms(lambda s: ioattn.flash_attn_func(*s, causal=causal), [(q, k, v)])
                            else:
                                qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                                out = ioattn.flash_attn_func(qq, kk, vv, causal=causal)
                                do = torch.randn_like(out)
                                ms = median_ms(lambda s: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True), [0])
                            rec["ms"] = ms
                            rec["tflops"] = attention_flops(b, h, n, n, d, causal, kind) / ms / 1e9
                        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                            rec["error"] = f"{type(e).__name__}: {str(e)[:150]}"
                        finally:
                            dispatch.set_tile_override(kind, None)
                        log.write(json.dumps(rec) + "\n")
                        log.flush()
                        key = (kind, d, causal, n)
                        if "tflops" in rec and rec["tflops"] > best.get(key, (0, None))[0]:
                            best[key] = (rec["tflops"], cfg)
                        print(rec, flush=True)
                    del q, k, v
    print("\nbest per (kind, headdim, causal, seqlen):")
    for key, (tf, cfg) in sorted(best.items()):
        print(f"  {key}: {cfg} {tf:.1f} TFLOP/s")
    # the winners as an IOATTN_TILES value (first causal/seqlen entry per kind and head dim wins)
    chosen = {}
    for (kind, d, causal, n), (tf, cfg) in sorted(best.items()):
        chosen.setdefault((kind, dispatch.block_d(d)), cfg)
    with open(os.path.join(args.out, "IOATTN_TILES"), "w") as f:
        f.write(";".join(f"{k}:{d}={','.join(map(str, c))}" for (k, d), c in chosen.items()))


if __name__ == "__main__":
    main()
