"""What ``ioattn bench SWEEP`` does once its arguments are parsed (``ioattn.cli``): run the sweep,
write the records, print the table, the ratios to the peers and the correctness summary."""
from __future__ import annotations

import json
import os

from ioattn.bench import report
from ioattn.bench.run import ceilings, default_dtype, run_sweep


def run_bench(args, device):
    """Run ``args.sweep`` on ``device``; exit status 0 when every ioattn record is ok, else 1."""
    dtype = args.dtype or default_dtype(device)
    if device == "cpu":
        print(f"No GPU found: these are CPU figures (ioattn's CPU path against PyTorch's CPU attention), {dtype}.")
    ceil = ceilings(device)
    if ceil:
        print(f"ceilings: bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s, "
              f"d2d copy {ceil['d2d_copy_gbps']:.0f} GB/s")
    sink, close = _sink(args, ceil)
    try:
        records = run_sweep(args.sweep, device, dtype, args.providers, log=lambda s: print(s, flush=True),
                            sink=sink, headdims=args.headdims, seqlens=args.seqlens,
                            batches=getattr(args, "batches", None), kvlens=getattr(args, "kvlens", None),
                            rounds=getattr(args, "rounds", None), layout=getattr(args, "layout", "separate"))
    finally:
        close()
    _summarise(records)
    if args.out:
        _write_plots(records, args.out)
    ours = [r for r in records if r["provider"].startswith("ioattn")]
    return 0 if ours and all(r.get("ok") for r in ours) else 1


def _sink(args, ceil):
    """(sink, close): every record gets the ceilings and the command, and goes to
    ``args.out``/results.jsonl as soon as it exists when ``--out`` is given."""
    command = "ioattn " + " ".join(args.argv)
    out = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        out = open(os.path.join(args.out, "results.jsonl"), "w")

    def sink(rec):
        rec["ceilings"] = ceil
        rec["command"] = command
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
    return sink, (out.close if out else (lambda: None))


def _summarise(records):
    print()
    print(report.table(records))
    lines = [*report.ratio_summary(records), report.check_summary(records)]
    if any(lines):
        print()
    for line in lines:
        if line:
            print(line)


def _write_plots(records, out_dir):
    print(f"\nwrote {len(records)} records to {os.path.join(out_dir, 'results.jsonl')}")
    try:
        for p in report.plot(records, out_dir):
            print(f"wrote {p}")
    except ImportError:  # matplotlib is the optional [bench] extra; the JSON is what matters
        print("no plots: matplotlib is not installed (pip install 'ioattn[bench]')")
