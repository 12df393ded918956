"""Host time of one decode call (what an eager caller pays on an idle device: Python, checks, plan,
launches), ioattn against SDPA's cuDNN backend, and where ioattn's goes (cProfile).

The bench's ``host_ms`` (one warm-up call) put ioattn at 134-324 us a call against cuDNN's 52-105
(results/session-2026-12-01-zi/decode): an eager decode loop at batch 1 would be host-bound at twice
the peer's step time. This measures it properly: median over ``--calls`` calls of the time each call
takes on the host (the device runs far ahead of nothing: the cases are short enough that the launch
queue never fills), then the profile of the same calls.

    python benchmarks/host_profile.py [--cases 1x4096,64x4096] [--calls 300] [--top 25]
"""
import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from ioattn.bench.providers import decode_providers
from ioattn.bench.run import _decode_inputs


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1x4096,64x4096")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--providers", default="ioattn,ioattn-checked,sdpa-cudnn")
    args = ap.parse_args()
    names = args.providers.split(",")
    rows = []
    for case in args.cases.split(","):
        batch, kvlen = (int(x) for x in case.split("x"))
        inputs = _decode_inputs((batch, kvlen, 32, 8, 128), torch.bfloat16, "cuda")
        table = decode_providers(names)
        for n in names:
            fn = table[n][0](*inputs)
            for _ in range(5):
                fn()
            med, best = host_us(fn, args.calls)
            rows.append((case, n, med, best))
        fn = table["ioattn"][0](*inputs)
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
        print(f"--- cProfile, ioattn {case}, {args.calls} calls (sorted by own time)")
        print(s.getvalue())
    print(f"{'case':<10} {'provider':<16} {'host us (median)':>17} {'best':>8}")
    for case, n, med, best in rows:
        print(f"{case:<10} {n:<16} {med:17.1f} {best:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
