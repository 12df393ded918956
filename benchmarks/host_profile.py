"""Host time of one decode call (what an eager caller pays on an idle device: Python, checks, plan,
launches), ioattn against SDPA's cuDNN backend, and where ioattn's goes (cProfile).

The bench's ``host_ms`` (one warm-up call) put ioattn at 134-324 us a call against cuDNN's 52-105
(results/session-2026-12-01-zi/decode): an eager decode loop at batch 1 would be host-bound at twice
the peer's step time. This measures it properly: the median over ``--calls`` calls of the time each
call takes on the host (a synchronize every 50 calls keeps the launch queue from filling, so no call
waits for the device), providers interleaved over ``--rounds``; then ioattn's profile (cProfile).
``ioattn-uncached``: the same call through Triton's own launch (``IOATTN_CACHED_LAUNCH=0``).

    python benchmarks/host_profile.py [--cases 1x4096,64x4096] [--calls 300] [--top 25] [--rounds 3]
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
    ap.add_argument("--providers", default="ioattn,ioattn-uncached,ioattn-checked,sdpa-cudnn",
                    help="decode providers; ioattn-uncached: the ioattn call with IOATTN_CACHED_LAUNCH=0")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median of the rounds' medians)")
    args = ap.parse_args()
    names = args.providers.split(",")
    rows = []
    for case in args.cases.split(","):
        batch, kvlen = (int(x) for x in case.split("x"))
        inputs = _decode_inputs((batch, kvlen, 32, 8, 128), torch.bfloat16, "cuda")
        table = decode_providers([n for n in names if n != "ioattn-uncached"] + ["ioattn"])
        fns = {n: table[n][0](*inputs) for n in names if n != "ioattn-uncached"}
        if "ioattn-uncached" in names:
            cached = table["ioattn"][0](*inputs)

            def uncached(call=cached):
                os.environ["IOATTN_CACHED_LAUNCH"] = "0"
                try:
                    return call()
                finally:
                    del os.environ["IOATTN_CACHED_LAUNCH"]
            fns["ioattn-uncached"] = uncached
        meds = {n: [] for n in names}
        for r in range(args.rounds):  # interleaved: round r starts at provider r
            for n in names[r % len(names):] + names[:r % len(names)]:
                for _ in range(5):
                    fns[n]()
                meds[n].append(host_us(fns[n], args.calls))
        for n in names:
            rows.append((case, n, statistics.median(m for m, _ in meds[n]), min(b for _, b in meds[n])))
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
    print(f"{'case':<10} {'provider':<16} {'host us (median)':>17} {'best':>8}   ({args.rounds} interleaved rounds)")
    for case, n, med, best in rows:
        print(f"{case:<10} {n:<16} {med:17.1f} {best:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
