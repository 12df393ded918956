"""A/B of forward variants in one process, with SDPA's flash and cuDNN backends timed beside them:
the exp2 mode of the unmasked tiles (``IOATTN_EXP2``: 0 special-function unit, 1 half on the FMA
polynomial, 2 all on it) crossed with the K/V load path (pointer / TMA descriptors).

    python benchmarks/ab_fwd.py --out DIR [--headdims 64,128] [--seqlens 1024,4096,16384]

bf16, 16384 tokens, hidden 2048 (the bench's grid). Every variant is checked against the float64
oracle (``ioattn.bench.run._check``) on the first sequence length of each (head dim, mask) before
it is timed; timing is ``ioattn.bench.timing.median_ms`` (device time, median of 20).
"""
import argparse
import json
import os
import sys

import torch

import ioattn
from ioattn import dispatch
from ioattn.bench.providers import providers
from ioattn.bench.run import _check
from ioattn.bench.timing import attention_flops, median_ms

VARIANTS = [(tma, exp) for tma in (False, True) for exp in (0, 1, 2)]


def variant_fn(tma, exp):
    def run(q, k, v, causal):
        os.environ["IOATTN_EXP2"] = str(exp)
        with dispatch.prefer_tma(tma):
            return ioattn.flash_attn_func(q, k, v, causal=causal)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, "ab_fwd.jsonl"), "w")
    peers = {n: fn for n, (fn, _) in providers(["sdpa-flash", "sdpa-cudnn"]).items() if fn is not None}
    fns = {f"ioattn-{'tma' if t else 'ptr'}-exp{e}": variant_fn(t, e) for t, e in VARIANTS}
    fns.update(peers)
    rows = []
    for d in map(int, args.headdims.split(",")):
        for causal in (False, True):
            ok = {}
            for n in map(int, args.seqlens.split(",")):
                shape = (16384 // n, n, 2048 // d, d)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                for name, fn in fns.items():
                    if name not in ok:
                        ok[name] = _check(fn, q, k, v, causal)[0]
                    with torch.no_grad():
                        ms = median_ms(lambda s: fn(*s, causal), [(q, k, v)])
                    tf = attention_flops(shape[0], shape[2], n, n, d, causal, "fwd") / ms / 1e9
                    rec = dict(headdim=d, causal=causal, seqlen=n, variant=name, ok=ok[name], ms=ms, tflops=tf)
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                    rows.append(rec)
    os.environ.pop("IOATTN_EXP2", None)
    names = list(fns)
    print(f"{'d':>3} {'c':>1} {'N':>6} " + " ".join(f"{n[-12:]:>12}" for n in names) + "   best/flash")
    for d in sorted({r["headdim"] for r in rows}):
        for causal in (False, True):
            for n in sorted({r["seqlen"] for r in rows}):
                cell = {r["variant"]: r for r in rows if (r["headdim"], r["causal"], r["seqlen"]) == (d, causal, n)}
                vals = [f"{cell[x]['tflops']:12.0f}" if cell[x]["ok"] else f"{'FAIL':>12}" for x in names]
                ours = max(r["tflops"] for x, r in cell.items() if x.startswith("ioattn") and r["ok"])
                ref = cell.get("sdpa-flash")
                ratio = f"{ours / ref['tflops']:.2f}" if ref else "-"
                print(f"{d:>3} {int(causal):>1} {n:>6} " + " ".join(vals) + f"   {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
