"""Host time of one eager call (what a caller pays on an idle device: Python, checks, plan, launches),
ioattn against SDPA's cuDNN backend, and where ioattn's goes (cProfile).

The median over ``--calls`` calls of the time each call takes on the host (a synchronize every 50
calls keeps the launch queue from filling, so no call waits for the device), providers interleaved
over ``--rounds``; then ioattn's profile (cProfile, sorted by own time).

    python benchmarks/host_profile.py --op decode [--cases 1x4096,64x4096]   # batch x cache length
    python benchmarks/host_profile.py --op fwd [--cases 128x1024,128x1024c]  # head dim x seqlen[causal]
    python benchmarks/host_profile.py --op bwd [--cases 128x1024]            # autograd.grad of one forward

``ioattn-uncached`` (decode): the same call through Triton's own launch (``IOATTN_CACHED_LAUNCH=0``).
The forward and backward run the latency sweep's shapes (16k tokens, hidden 2048, bf16).
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

from ioattn.bench.providers import decode_providers, providers
from ioattn.bench.run import _decode_inputs

DEFAULT_CASES = {"decode": "1x4096,64x4096", "fwd": "128x1024,128x1024c,64x1024", "bwd": "128x1024,128x1024c"}
DEFAULT_PROVIDERS = {"decode": "ioattn,ioattn-uncached,ioattn-checked,sdpa-cudnn", "fwd": "ioattn,sdpa-cudnn",
                     "bwd": "ioattn,sdpa-cudnn"}


def host_us(fn, calls):
    times = []
    for i in range(calls):
        if i % 50 == 0:
            torch.cuda.synchronize()  # keep the queue short: the host never waits on a full queue
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times), min(times)


def _uncached(call):
    def run():
        os.environ["IOATTN_CACHED_LAUNCH"] = "0"
        try:
            return call()
        finally:
            del os.environ["IOATTN_CACHED_LAUNCH"]
    return run


def decode_calls(case, names):
    batch, kvlen = (int(x) for x in case.split("x"))
    inputs = _decode_inputs((batch, kvlen, 32, 8, 128), torch.bfloat16, "cuda")
    table = decode_providers([n for n in names if n != "ioattn-uncached"] + ["ioattn"])
    fns = {n: table[n][0](*inputs) for n in names if n != "ioattn-uncached"}
    if "ioattn-uncached" in names:
        fns["ioattn-uncached"] = _uncached(table["ioattn"][0](*inputs))
    return fns


def train_calls(case, names, op):
    """fwd: the call under no_grad; bwd: torch.autograd.grad of one forward (retain_graph), as the
    latency sweep times them."""
    d, n = case.rstrip("c").split("x")
    d, n, causal = int(d), int(n), case.endswith("c")
    nheads = 2048 // d
    shape = (max(1, 16384 // n), n, nheads, d)
    table = providers(names)
    fns = {}
    for name in names:
        fn = table[name][0]
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=op == "bwd") for _ in range(3))
        if op == "fwd":
            def run(fn=fn, q=q, k=k, v=v):
                with torch.no_grad():
                    return fn(q, k, v, causal)
        else:
            out = fn(q, k, v, causal)
            dout = torch.randn_like(out)

            def run(out=out, q=q, k=k, v=v, dout=dout):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        fns[name] = run
    return fns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=("decode", "fwd", "bwd"), default="decode")
    ap.add_argument("--cases", default=None, help="decode: BATCHxKVLEN; fwd / bwd: HEADDIMxSEQLEN, 'c' for causal")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--providers", default=None, help="comma-separated provider names (ioattn first)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median of the rounds' medians)")
    args = ap.parse_args()
    names = (args.providers or DEFAULT_PROVIDERS[args.op]).split(",")
    rows = []
    for case in (args.cases or DEFAULT_CASES[args.op]).split(","):
        fns = decode_calls(case, names) if args.op == "decode" else train_calls(case, names, args.op)
        meds = {n: [] for n in names}
        for r in range(args.rounds):  # interleaved: round r starts at provider r
            for n in names[r % len(names):] + names[:r % len(names)]:
                for _ in range(5):
                    fns[n]()
                meds[n].append(host_us(fns[n], args.calls))
        for n in names:
            rows.append((case, n, statistics.median(m for m, _ in meds[n]), min(b for _, b in meds[n])))
        fn = fns[names[0]]
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for i in range(args.calls):
            fn()
            if i % 50 == 0:
                torch.cuda.synchronize()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
        print(f"--- cProfile, {names[0]} {args.op} {case}, {args.calls} calls (sorted by own time)")
        print(s.getvalue())
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(args.top)
        print(f"--- cProfile, {names[0]} {args.op} {case} (sorted by cumulative time)")
        print(s.getvalue())
    print(f"{'case':<12} {'provider':<16} {'host us (median)':>17} {'best':>8}   ({args.rounds} interleaved rounds)")
    for case, n, med, best in rows:
        print(f"{case:<12} {n:<16} {med:17.1f} {best:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
