"""Where a decode step's time goes on the device: the kernels of each provider's call, their durations
and the gaps between them, from the profiler's device timeline (CUPTI through torch.profiler).

Each (provider, case): the call set up as ``ioattn bench decode`` sets it up, warmed up, then
``--calls`` calls queued back to back behind a busy-wait kernel (so the host is ahead, as in the
bench's timing) and profiled. Per call: its kernels in order, each's duration, the gap before each
(from the previous kernel's end), and the span from the first kernel's start to the last one's end;
medians over the calls. The question (docs/decisions/decode-launches.md): at batch 1 x 16k / 64k keys ioattn's eager step is
0.5 us behind cuDNN's while its graph replay is level; which part (split kernel, merge, the gap
between them) is the difference?

    python benchmarks/decode_timeline.py --out OUT.json [--cases 1x16384,1x65536] [--providers ioattn,sdpa-cudnn]

``ioattn-noseqlens``: the ``ioattn`` call without ``cache_seqlens`` (the caches are full), so the split
kernel does not load the lengths before its key ranges are known. ``ioattn+FIELD=INT+...``: the
``ioattn`` call under ``decode_config(FIELD=INT, ...)`` (e.g. ``ioattn+pdl_wait=0``,
``ioattn+num_splits=16``).
"""
import argparse
import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ioattn.bench.providers import decode_providers
from ioattn.bench.run import _decode_inputs, decode_bytes
from ioattn.bench.timing import median_ms, n_input_sets


def kernels_of(prof):
    """Device kernel events (name, start us, duration us), in start order."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            out.append((e.name, e.time_range.start, e.time_range.elapsed_us()))
    return sorted(out, key=lambda x: x[1])


def _with_config(setup, fields):
    from ioattn.decode import decode_config

    def configured(q, k, v, seqlens):
        with decode_config(**fields):
            run = setup(q, k, v, seqlens)

        def call():
            with decode_config(**fields):
                return run()
        return call
    return configured


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="1x4096,1x16384,1x65536,8x8192")
    ap.add_argument("--providers", default="ioattn,sdpa-cudnn")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="bench timing (median_ms) rounds per provider, interleaved")
    args = ap.parse_args()
    names = args.providers.split(",")
    table = decode_providers([n for n in names if n != "ioattn-noseqlens" and "+" not in n])
    if "ioattn-noseqlens" in names:  # the same call without cache_seqlens (every cache full): no length load
        import ioattn
        table["ioattn-noseqlens"] = (lambda q, k, v, _: lambda: ioattn.flash_attn_with_kvcache(q, k, v), "")
    for name in (n for n in names if "+" in n):  # "ioattn+field=value+...": the ioattn call under decode_config
        base, *pairs = name.split("+")
        fields = {key: int(val) for key, val in (p.split("=") for p in pairs)}
        table[name] = (_with_config(decode_providers([base])[base][0], fields), "")
    table = {n: table[n] for n in names if n in table}
    results = []
    for case in args.cases.split(","):
        batch, kvlen = map(int, case.split("x"))
        shape = (batch, kvlen, 32, 8, 128)
        sets = [_decode_inputs(shape, torch.bfloat16, "cuda")
                for _ in range(n_input_sets(decode_bytes(batch, kvlen, 8, 128, 2)))]  # rotated past L2
        for name, (setup, why) in table.items():
            if setup is None:
                print(f"{name}: {why}")
                continue
            runs = [setup(*s) for s in sets]
            for r in runs:
                r()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(int(20e6))  # ~10 ms: the host queues every call before the first runs
                for i in range(args.calls):
                    runs[i % len(runs)]()
                torch.cuda.synchronize()
            ks = [k for k in kernels_of(prof) if k[2] < 5000.0]  # not the ~10 ms busy-wait
            per_call = len(ks) // args.calls
            if per_call == 0 or len(ks) % args.calls:
                print(f"{name} {case}: {len(ks)} kernels for {args.calls} calls; not a whole number a call")
                continue
            calls = [ks[i * per_call:(i + 1) * per_call] for i in range(args.calls)]
            rows = []
            end = lambda kern: kern[1] + kern[2]  # noqa: E731
            for j in range(per_call):
                durs = [c[j][2] for c in calls]
                if j:  # from the call's previous kernel
                    gaps = [c[j][1] - end(c[j - 1]) for c in calls]
                else:  # from the previous call's last kernel
                    gaps = [calls[i][0][1] - end(calls[i - 1][-1]) for i in range(1, len(calls))]
                rows.append(dict(kernel=calls[0][j][0][:90], dur_us=statistics.median(durs),
                                 gap_before_us=statistics.median(gaps) if gaps else None))
            spans = [end(c[-1]) - c[0][1] for c in calls]
            period = statistics.median([calls[i + 1][0][1] - calls[i][0][1] for i in range(args.calls - 1)])
            rec = dict(provider=name, batch=batch, kvlen=kvlen, kernels=rows, span_us=statistics.median(spans),
                       period_us=period, kernels_per_call=per_call, total_kernels=len(ks))
            results.append(rec)
            print(f"{name:<12} {batch}x{kvlen:<7} span {rec['span_us']:6.1f} us, call period {period:6.1f} us, "
                  f"{per_call} kernel(s) a call")
            for r in rows:
                gap = f"{r['gap_before_us']:5.1f}" if r["gap_before_us"] is not None else "    -"
                print(f"    gap {gap}  dur {r['dur_us']:6.1f}  {r['kernel']}")
        # the bench's timing of the same calls, providers interleaved in rounds (ioattn bench decode's method)
        prepared = {n: [setup(*st) for st in sets] for n, (setup, _) in table.items() if setup is not None}
        order, times = list(prepared), {n: [] for n in prepared}
        for r in range(args.rounds):
            for n in order[r % len(order):] + order[:r % len(order)]:
                times[n].append(median_ms(lambda run: run(), prepared[n]) * 1e3)
        line = []
        for n in order if args.rounds > 0 else ():
            med = statistics.median(times[n])
            for rec in results:
                if (rec["provider"], rec["batch"], rec["kvlen"]) == (n, batch, kvlen):
                    rec.update(bench_us=med, bench_rounds_us=times[n])
            line.append(f"{n} {med:.1f} ({'/'.join(f'{x:.1f}' for x in times[n])})")
        if line:
            print(f"bench timing {batch}x{kvlen}: " + "; ".join(line))
        del sets, runs, prepared
        torch.cuda.empty_cache()
    json.dump(results, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
