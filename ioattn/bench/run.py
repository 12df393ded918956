"""``ioattn bench``: sweeps of every provider side by side, correctness first, JSON lines out."""
from __future__ import annotations

import json
import math
import platform
import sys
from dataclasses import dataclass, replace

import torch

from ioattn.bench.providers import providers
from ioattn.bench.timing import attention_flops, median_ms, n_input_sets
from ioattn.reference import attention_ref

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Sweep:
    headdims: tuple
    seqlens: tuple
    causal: tuple = (False, True)
    modes: tuple = ("fwd", "bwd")
    tokens: int = 16384  # batch * seqlen, as the FlashAttention papers plot it
    hidden: int = 2048   # nheads * headdim
    providers: tuple = ("ioattn", "ioattn-tma", "sdpa-flash", "sdpa-cudnn")


GPU_SWEEPS = {
    "train": Sweep(headdims=(64, 128, 256), seqlens=(512, 1024, 2048, 4096, 8192, 16384)),
    "quick": Sweep(headdims=(64, 128), seqlens=(1024, 4096, 16384)),
}
# Without a GPU: the CPU path (tiled reference) against PyTorch's CPU attention, small sizes.
CPU_SWEEPS = {
    "quick": Sweep(headdims=(64,), seqlens=(256, 1024), tokens=1024, hidden=256,
                   providers=("ioattn", "sdpa-math")),  # ioattn-tma is the same CPU path here
}


def environment():
    env = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["cudnn"] = torch.backends.cudnn.version()
        env["cuda"] = torch.version.cuda
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return env


def ceilings(device):
    """Same-run ceilings: a large bf16 matrix product and a device-to-device copy."""
    if device != "cuda":
        return {}
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ms = median_ms(lambda s: s[0] @ s[1], [(a, b)], warmup=3, reps=20)
    src = torch.randn(2**29, device=device, dtype=torch.float32)  # 2 GiB
    dst = torch.empty_like(src)
    ms_copy = median_ms(lambda s: s[1].copy_(s[0]), [(src, dst)], warmup=3, reps=20)
    return {"bf16_matmul_tflops": 2 * 8192**3 / ms / 1e9, "d2d_copy_gbps": 2 * src.numel() * 4 / ms_copy / 1e6}


def _check(fn, q, k, v, causal):
    """Output of ``fn`` vs the float64 oracle, against PyTorch's own same-dtype error."""
    window = (-1, 0) if causal else (-1, -1)
    ref, _ = attention_ref(q, k, v, window=window)
    same, _ = attention_ref(q, k, v, window=window, upcast=False)
    out = fn(q, k, v, causal)
    err = (out.double() - ref).abs().max().item()
    base = (same.double() - ref).abs().max().item()
    return (not math.isnan(err)) and err <= 2 * base + 1e-4, err


def run_sweep(name, device, dtype_name="bf16", provider_names=None, log=print, sink=None, headdims=None):
    """Run one sweep; every record also goes to ``sink`` as soon as it exists (a cut-off run keeps
    what it measured)."""
    sweeps = GPU_SWEEPS if device == "cuda" else CPU_SWEEPS
    if name not in sweeps:
        log(f"unknown sweep {name!r} for {device}; known: {', '.join(sweeps)}")
        return []
    sw = sweeps[name]
    if headdims:
        sw = replace(sw, headdims=tuple(headdims))
    env = environment()
    dtype = DTYPES[dtype_name]
    table = providers(provider_names or sw.providers)
    for pname, (fn, why) in table.items():
        if fn is None:
            log(f"{pname}: skipped ({why})")
    records = _Records(sink, env)
    for d in sw.headdims:
        for causal in sw.causal:
            checked = {}
            for n in sw.seqlens:
                batch, nheads = max(1, sw.tokens // n), max(1, sw.hidden // d)
                shape = (batch, n, nheads, d)
                sets = [tuple(torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
                        for _ in range(n_input_sets(3 * math.prod(shape) * 2))]
                for pname, (fn, why) in table.items():
                    base = dict(sweep=name, provider=pname, dtype=dtype_name, batch=batch, nheads=nheads,
                                nheads_kv=nheads, headdim=d, seqlen_q=n, seqlen_k=n, causal=causal,
                                paged=False, device=env["device"])
                    if fn is None:
                        records.append(dict(base, mode="fwd", ms=None, tflops=None, ok=False, error=why))
                        continue
                    try:
                        if pname not in checked:  # correctness on the first shape of each configuration
                            checked[pname] = _check(fn, *sets[0], causal)
                        ok, err = checked[pname]
                        for mode in sw.modes:
                            ms = _time(fn, sets, causal, mode)
                            tf = attention_flops(batch, nheads, n, n, d, causal, mode) / ms / 1e9
                            rec = dict(base, mode=mode, ms=ms, tflops=tf if ok else None, ok=ok,
                                       max_err=err)
                            if not ok:
                                rec["error"] = f"failed the correctness check (max err {err:.3g})"
                            records.append(rec)
                            log(_line(rec))
                    except Exception as e:  # noqa: BLE001 - a provider that cannot run a shape is reported
                        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                        records.append(dict(base, mode="fwd", ms=None, tflops=None, ok=False, error=msg))
                        log(f"{pname} d={d} n={n} causal={causal}: cannot run ({msg})")
                        if device == "cuda":
                            torch.cuda.empty_cache()
                del sets
    return list(records)


class _Records(list):
    def __init__(self, sink, env):
        super().__init__()
        self.sink, self.env = sink, env

    def append(self, rec):
        rec.setdefault("env", self.env)
        super().append(rec)
        if self.sink is not None:
            self.sink(rec)


def _time(fn, sets, causal, mode):
    if mode == "fwd":
        with torch.no_grad():
            return median_ms(lambda s: fn(*s, causal), sets)
    graded = []
    for s in sets:
        q, k, v = (t.detach().requires_grad_() for t in s)
        out = fn(q, k, v, causal)
        graded.append((out, torch.randn_like(out), (q, k, v)))
    return median_ms(lambda g: torch.autograd.grad(g[0], g[2], g[1], retain_graph=True), graded)


def _line(r):
    tf = f"{r['tflops']:7.1f} TFLOP/s" if r.get("tflops") is not None else "   (failed)    "
    return (f"{r['provider']:<15} {r['mode']:<4} d={r['headdim']:<3} n={r['seqlen_q']:<6} "
            f"causal={int(r['causal'])} {r['ms']:9.3f} ms {tf}")


def summary(records, ours="ioattn", peer="sdpa-flash"):
    """Rows of (headdim, causal, seqlen, mode, ours, peer, best other, ratio to peer, ratio to best)."""
    by = {}
    for r in records:
        if r.get("tflops") is None:
            continue
        by.setdefault((r["headdim"], r["causal"], r["seqlen_q"], r["mode"]), {})[r["provider"]] = r["tflops"]
    rows = []
    for key in sorted(by):
        vals = by[key]
        if ours not in vals:
            continue
        others = {p: t for p, t in vals.items() if not p.startswith("ioattn")}
        best = max(others.items(), key=lambda x: x[1]) if others else (None, float("nan"))
        p = vals.get(peer, float("nan"))
        rows.append((*key, vals[ours], p, best[0], best[1], vals[ours] / p, vals[ours] / best[1]))
    return rows


def format_summary(rows, peer="sdpa-flash"):
    out = [f"{'d':>4} {'causal':>6} {'seqlen':>6} {'mode':>4} {'ours':>8} {peer:>10} {'best peer':>22} "
           f"{'x ' + peer:>14} {'x best':>7}"]
    for d, c, n, mode, ours, p, bname, b, rp, rb in rows:
        out.append(f"{d:>4} {int(c):>6} {n:>6} {mode:>4} {ours:8.1f} {p:10.1f} {str(bname):>12} {b:9.1f} "
                   f"{rp:14.2f} {rb:7.2f}")
    return "\n".join(out)


def write_jsonl(records, path):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def main(argv=None):
    import argparse
    import os

    ap = argparse.ArgumentParser(prog="ioattn bench", description="Benchmark ioattn against its peers.")
    ap.add_argument("sweep", nargs="?", default="quick", help="train | quick")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--providers", default=None, help="comma-separated provider names")
    ap.add_argument("--out", default=None, help="directory for results.jsonl")
    ap.add_argument("--headdims", default=None, help="comma-separated subset of the sweep's head dims")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("No GPU found: these are CPU figures (ioattn's tiled CPU path against PyTorch's CPU attention).")
    names = args.providers.split(",") if args.providers else None
    ceil = ceilings(device)
    if ceil:
        print(f"ceilings: bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s, "
              f"d2d copy {ceil['d2d_copy_gbps']:.0f} GB/s")
    sink_file = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "results.jsonl")
        sink_file = open(path, "w")

    def sink(rec):
        rec["ceilings"] = ceil
        rec["command"] = "ioattn bench " + " ".join(argv if argv is not None else sys.argv[1:])
        if sink_file:
            sink_file.write(json.dumps(rec) + "\n")
            sink_file.flush()

    records = run_sweep(args.sweep, device, args.dtype, names, log=lambda s: print(s, flush=True), sink=sink,
                        headdims=[int(x) for x in args.headdims.split(",")] if args.headdims else None)
    peer = next(p for p in (names or (GPU_SWEEPS if device == "cuda" else CPU_SWEEPS)[args.sweep].providers)
                if not p.startswith("ioattn"))
    for ours in dict.fromkeys(r["provider"] for r in records if r["provider"].startswith("ioattn")):
        print(f"\n{ours}:")
        print(format_summary(summary(records, ours=ours, peer=peer), peer=peer))
    if sink_file:
        sink_file.close()
        print(f"\nwrote {len(records)} records to {path}")
    return 0 if all(r.get("ok") for r in records if r["provider"].startswith("ioattn")) else 1
