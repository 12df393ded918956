"""Sustained-load probe: is a kernel limited by the board's power cap, and what does a call cost in
energy, against cuDNN's on the same shape?

Each (pass, head dim, mask) runs back to back for ``--seconds`` per provider, providers alternating,
with ``--rest`` idle seconds between runs, while ``nvidia-smi`` samples the SM clock and board power
into the CSV given as ``--smi``. The caller starts the sampler before the probe and stops it after;
the probe reads the time, SM clock, board power and clock-event reasons from columns 1, 2, 4 and 6:

    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
        --format=csv,noheader -lms 50 > SMI.csv &

(one command line; older drivers name the last field ``clocks_throttle_reasons.active``). The window
is the run's second half (the power limiter has settled): device time per call (events
around chunks of calls), the mean SM clock and board power of the samples inside it, joules per call
(power x time, idle power included) and TFLOP/s. bf16, 16384 tokens, hidden 2048 (the bench's grid).

    python benchmarks/power_probe.py --smi SMI.csv --out OUT.jsonl [--configs fwd:128:0,fwd:128:1,...]
"""
import argparse
import datetime
import json
import statistics
import sys
import time

import torch

from ioattn.bench.providers import providers
from ioattn.bench.timing import attention_flops

SMI_TIME = "%Y/%m/%d %H:%M:%S.%f"


def call_for(fn, mode, q, k, v, causal, dout):
    if mode == "fwd":
        return lambda: fn(q, k, v, causal)
    return lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)


def sustained(call, seconds, chunk=8):
    """Back-to-back calls for ``seconds``; (wall start/mid/end, device ms per call over the second half)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0 = time.time()
    marks = []  # (wall time at the chunk's queueing, start event, end event, calls)
    while time.time() - t0 < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(chunk):
            call()
        end.record()
        end.synchronize()
        marks.append((time.time(), start, end, chunk))
    t1 = time.time()
    half = [m for m in marks if m[0] >= t0 + seconds / 2] or marks[-1:]
    ms = sum(s.elapsed_time(e) for _, s, e, _ in half) / sum(c for *_, c in half)
    return t0, t0 + seconds / 2, t1, ms


def smi_window(path, t_from, t_to):
    """(mean SM clock MHz, mean board power W, samples, reasons seen) of the samples in [t_from, t_to]."""
    clocks, power, reasons = [], [], set()
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], SMI_TIME).timestamp()
        except ValueError:
            continue
        if t_from <= t <= t_to:
            clocks.append(float(f[1].split()[0]))
            power.append(float(f[3].split()[0]))
            reasons.add(f[5])
    if not clocks:
        return None, None, 0, []
    return statistics.mean(clocks), statistics.mean(power), len(clocks), sorted(reasons)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smi", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="fwd:128:0,fwd:128:1,fwd:64:0,fwd:256:0,fwdbwd:128:0",
                    help="pass:headdim:causal, comma-separated (pass fwd or fwdbwd)")
    ap.add_argument("--providers", default="ioattn,sdpa-cudnn")
    ap.add_argument("--seconds", type=float, default=1.6)
    ap.add_argument("--rest", type=float, default=1.0)
    ap.add_argument("--seqlen", type=int, default=16384)
    args = ap.parse_args()
    table = providers(args.providers.split(","))
    sink = open(args.out, "w")
    rows = []
    for cfg in args.configs.split(","):
        mode, d, causal = cfg.split(":")
        d, causal, n = int(d), bool(int(causal)), args.seqlen
        shape = (16384 // n, n, 2048 // d, d)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=mode != "fwd")
                   for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        flops = attention_flops(shape[0], shape[2], n, n, d, causal, mode)
        for name, (fn, why) in table.items():
            if fn is None:
                print(f"{name}: {why}")
                continue
            time.sleep(args.rest)
            ctx = torch.no_grad() if mode == "fwd" else torch.enable_grad()
            with ctx:
                t0, tmid, t1, ms = sustained(call_for(fn, mode, q, k, v, causal, dout), args.seconds)
            rec = dict(provider=name, mode=mode, headdim=d, causal=causal, seqlen=n, ms=ms,
                       tflops=flops / ms / 1e9, t0=t0, tmid=tmid, t1=t1)
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
            rows.append(rec)
    sink.close()
    time.sleep(0.5)  # the sampler's last lines
    out = []
    for r in rows:
        clock, watts, samples, reasons = smi_window(args.smi, r["tmid"], r["t1"])
        r.update(sm_mhz=clock, watts=watts, samples=samples, reasons=reasons,
                 joules=None if watts is None else watts * r["ms"] / 1e3)
        out.append(r)
    with open(args.out, "w") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    print(f"{'pass':>6} {'d':>3} {'c':>1} {'provider':>11} {'ms':>7} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>5} "
          f"{'J/call':>7} {'n':>3}  reasons")
    for r in out:
        j = f"{r['joules']:.3f}" if r["joules"] is not None else "-"
        print(f"{r['mode']:>6} {r['headdim']:>3} {int(r['causal']):>1} {r['provider']:>11} {r['ms']:7.3f} "
              f"{r['tflops']:8.0f} {r['sm_mhz'] or 0:7.0f} {r['watts'] or 0:5.0f} {j:>7} {r['samples']:>3}  "
              f"{','.join(x[-3:] for x in r['reasons'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
