"""``ioattn bench``: every provider side by side, correctness first, one JSON line per measurement.

Sweeps: ``train`` (forward, backward, forward+backward on the papers' grid), ``memory`` (peak
device memory of forward+backward against sequence length), ``quick`` (a short default; on a
machine without a GPU, the CPU path against PyTorch's CPU attention), ``decode`` (one query token
per sequence over a full KV cache, 32 query heads / 8 KV heads, d 128, on the (batch, KV length)
cases of ``DECODE_CASES``; GB/s of K and V read; ``ioattn`` also replayed from a CUDA graph as
``ioattn-graph``; on a machine without a GPU, small sizes against sdpa-math).
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
from dataclasses import dataclass, replace

import torch

from ioattn.bench.providers import decode_providers, providers
from ioattn.bench.timing import attention_flops, median_ms, n_input_sets
from ioattn.reference import attention_ref
from ioattn.reference.decode import kvcache_attention_ref

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# How q, k, v are laid out in memory, the same for every provider: "separate" (three contiguous
# tensors), "qkvpacked" (the views ``qkv.unbind(2)`` of one (batch, seqlen, 3, heads, d) tensor, as
# a fused QKV projection produces them and flash_attn_qkvpacked_func takes them) or "bhnd" (three
# (batch, heads, seqlen, d) tensors, SDPA's order, transposed to flash-attn's).
LAYOUTS = ("separate", "qkvpacked", "bhnd")
ALL_PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex", "flash-attn", "flash-attn-cute")


@dataclass(frozen=True)
class Sweep:
    headdims: tuple
    seqlens: tuple
    causal: tuple = (False, True)
    modes: tuple = ("fwd", "bwd", "fwdbwd")
    tokens: int = 16384  # batch * seqlen, as the FlashAttention papers plot it
    hidden: int = 2048   # nheads * headdim
    providers: tuple = ("ioattn", "ioattn-ptr", "ioattn-hopper") + ALL_PEERS
    memory: bool = False  # peak memory of forward+backward instead of time


PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
GPU_SWEEPS = {
    "train": Sweep(headdims=(64, 128, 256), seqlens=PAPER_SEQLENS),
    "quick": Sweep(headdims=(64, 128), seqlens=(1024, 4096, 16384), modes=("fwd", "bwd"),
                   providers=("ioattn", "sdpa-flash", "sdpa-cudnn")),
    # one sequence of 16 heads of dim 128, doubling until standard attention no longer fits
    "memory": Sweep(headdims=(128,), seqlens=tuple(2**i for i in range(10, 18)), causal=(False,),
                    modes=("fwdbwd",), tokens=0, providers=("ioattn", "sdpa-math"), memory=True),
}
# Without a GPU: the CPU path (tiled reference) against PyTorch's CPU attention, small sizes.
CPU_SWEEPS = {
    "quick": Sweep(headdims=(64,), seqlens=(256, 1024), tokens=1024, hidden=256, modes=("fwd", "bwd"),
                   providers=("ioattn", "sdpa-math")),
}


@dataclass(frozen=True)
class DecodeSweep:
    """One query token per sequence; every sequence fills its cache (cache_seqlens = capacity = kvlen)."""
    cases: tuple  # (batch, kvlen) pairs
    nheads: int = 32
    nheads_kv: int = 8
    headdims: tuple = (128,)
    providers: tuple = ("ioattn", "ioattn-graph", "ioattn-checked", "ioattn-paged", "ioattn-unified", "ioattn-nopdl",
                        "ioattn-graph-nopdl") + ALL_PEERS


DECODE_CASES = ((1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 8192), (32, 32768), (64, 4096))
GPU_DECODE = {"decode": DecodeSweep(cases=DECODE_CASES)}
CPU_DECODE = {"decode": DecodeSweep(cases=((1, 256), (1, 1024), (2, 256), (2, 1024)), nheads=4, nheads_kv=2,
                                    headdims=(64,), providers=("ioattn", "ioattn-paged", "sdpa-math"))}
DECODE_CHECK_BATCH = 2  # the correctness check runs on the first case, cut to at most this batch
# Interleaved timing rounds per decode case (``run_decode_sweep``; ``--rounds``): three give a median
# that one outlying round cannot move, at ~3x the timed calls (a case's calls take < 25 ms each round).
DECODE_ROUNDS = 3
# The same for the timed training sweeps (``_time_rounds``): with one timing per provider in a fixed
# order, ioattn always ran first at a point, right after the previous point's cuDNN forward+backward,
# and cuDNN right after SDPA flash's: under the H200's power cap the clock a timing starts at follows
# what ran before it (benchmarks/NOTES.md §43, §65), so the order favoured one provider.
TIME_ROUNDS = 3


def decode_bytes(batch, kvlen, nheads_kv, d, itemsize):
    """Bytes of K and V one decode step reads: 2 * batch * kvlen * nheads_kv * d * itemsize (the
    query and output, batch * nheads * d each, are left out)."""
    return 2 * batch * kvlen * nheads_kv * d * itemsize


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
        env["driver"] = _driver_version()
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return env


def _driver_version():
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - informational only
        return None


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


def _shape(sw, d, n):
    batch = max(1, sw.tokens // n) if sw.tokens else 1
    return batch, n, max(1, sw.hidden // d), d


class _Progress:
    """A one-line progress bar on stderr (only when it is a terminal)."""

    def __init__(self, total):
        self.total, self.done = max(total, 1), 0
        self.tty = sys.stderr.isatty()

    def step(self, what):
        self.done += 1
        if self.tty:
            filled = int(30 * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {what:<40}")
            sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")


def _inputs(shape, dtype, device, layout):
    """One input set (q, k, v) of ``shape`` in ``layout`` (``LAYOUTS``)."""
    batch, n, nheads, d = shape
    if layout == "qkvpacked":
        return torch.randn(batch, n, 3, nheads, d, device=device, dtype=dtype).unbind(2)
    if layout == "bhnd":
        return tuple(torch.randn(batch, nheads, n, d, device=device, dtype=dtype).transpose(1, 2) for _ in range(3))
    return tuple(torch.randn(shape, device=device, dtype=dtype) for _ in range(3))


def run_sweep(name, device, dtype_name="bf16", provider_names=None, log=print, sink=None, headdims=None,
              seqlens=None, batches=None, kvlens=None, rounds=None, layout="separate"):
    """Run one sweep and return its records; every record also goes to ``sink`` as soon as it exists
    (a run cut off by a time limit keeps what it measured). Problems are logged, never raised.
    ``batches``/``kvlens`` are for ``decode`` only (``seqlens`` is read as ``kvlens`` there);
    ``rounds``: interleaved timing rounds per point (``_time_rounds``; default ``TIME_ROUNDS`` on a
    GPU, one on the CPU), the decode sweep's ``DECODE_ROUNDS``. ``layout``: the inputs' memory layout
    (``LAYOUTS``; training sweeps only), recorded in every record."""
    if name in GPU_DECODE:
        if layout != "separate":
            log("--layout is for the training sweeps; ignored")
        return run_decode_sweep(name, device, dtype_name, provider_names, log, sink, headdims,
                                batches, kvlens or seqlens, DECODE_ROUNDS if rounds is None else rounds)
    sweeps = GPU_SWEEPS if device == "cuda" else CPU_SWEEPS
    if name not in sweeps:
        log(f"unknown sweep {name!r} on {device}; known here: {', '.join([*sweeps, *GPU_DECODE])}")
        return []
    if batches or kvlens:
        log("--batches/--kvlens are for the decode sweep; ignored")
    if rounds is None:
        rounds = TIME_ROUNDS if device == "cuda" else 1
    sw = sweeps[name]
    if headdims:
        sw = replace(sw, headdims=tuple(headdims))
    if seqlens:
        sw = replace(sw, seqlens=tuple(seqlens))
    if dtype_name not in DTYPES:
        log(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
        return []
    if layout not in LAYOUTS:
        log(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
        return []
    env = _env_cached()
    table = providers(provider_names or sw.providers)
    records = _Records(sink, env, layout)
    for pname, (fn, why) in table.items():
        if fn is None:
            log(f"{pname}: skipped ({why})")
            for d in sw.headdims:
                for causal in sw.causal:
                    records.append(_base(name, pname, dtype_name, _shape(sw, d, sw.seqlens[0]), causal, env,
                                         mode=sw.modes[0], ok=False, error=why))
    runnable = {p: fn for p, (fn, _) in table.items() if fn is not None}
    bar = _Progress(len(sw.headdims) * len(sw.causal) * len(sw.seqlens) * len(runnable))
    for d in sw.headdims:
        for causal in sw.causal:
            checked = {}
            for n in sw.seqlens:
                shape = _shape(sw, d, n)
                try:
                    sets = [_inputs(shape, DTYPES[dtype_name], device, layout)
                            for _ in range(1 if sw.memory else n_input_sets(3 * math.prod(shape) * 2))]
                except torch.cuda.OutOfMemoryError:  # (torch.OutOfMemoryError needs torch >= 2.5)
                    log(f"d={d} n={n}: inputs do not fit in device memory; stopping this configuration")
                    break
                timed = {}  # provider -> its correctness result; timed below in interleaved rounds
                for pname, fn in runnable.items():
                    bar.step(f"{pname} d={d} n={n} causal={int(causal)}")
                    base = dict(sweep=name, provider=pname, dtype=dtype_name, shape=shape, causal=causal, env=env)
                    try:
                        if sw.memory:
                            records.append(_measure_memory(fn, sets[0], causal, base))
                            log(_line(records[-1]))
                        else:
                            if pname not in checked:  # correctness on the first shape of each configuration
                                checked[pname] = _check(fn, *sets[0], causal)
                            timed[pname] = checked[pname]
                    except Exception as e:  # noqa: BLE001 - a provider that cannot run a shape is reported
                        _train_failed(records, log, name, pname, dtype_name, shape, causal, env, sw.modes[0], e)
                    finally:
                        if device == "cuda":
                            torch.cuda.empty_cache()
                if timed:
                    _time_rounds(runnable, timed, sets, causal, sw.modes, rounds, records, log,
                                 dict(sweep=name, dtype=dtype_name, shape=shape, causal=causal, env=env))
                    if device == "cuda":
                        torch.cuda.empty_cache()
                del sets
    bar.close()
    return list(records)


def decode_cases(sw, batches=None, kvlens=None):
    """The sweep's (batch, kvlen) cases; when ``batches`` or ``kvlens`` is given, their cross product
    instead (batches default to 1, KV lengths to the sweep's own)."""
    if not batches and not kvlens:
        return tuple(sw.cases)
    ks = tuple(kvlens) if kvlens else tuple(sorted({n for _, n in sw.cases}))
    return tuple((b, n) for b in (tuple(batches) if batches else (1,)) for n in ks)


def run_decode_sweep(name, device, dtype_name="bf16", provider_names=None, log=print, sink=None, headdims=None,
                     batches=None, kvlens=None, rounds=DECODE_ROUNDS):
    """The decode sweep (see ``run_sweep``): per (head dim, case), every provider is set up on each
    input set outside the timed region, then the providers' ``run()`` are timed with ``median_ms`` in
    ``rounds`` interleaved rounds (round r starts at provider r, so no provider always runs first or
    after the same one); a record's time is the median of its rounds' medians, ``ms_rounds`` lists
    them. Steps of 15-1000 us sit within ~1.5 % of each other from one run to the next on the H200
    (benchmarks/NOTES.md §41): one timing per provider lets a drift of the machine between two
    providers' turns decide the order of two kernels at the same speed."""
    sw = (GPU_DECODE if device == "cuda" else CPU_DECODE)[name]
    if headdims:
        sw = replace(sw, headdims=tuple(headdims))
    if dtype_name not in DTYPES:
        log(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
        return []
    cases = decode_cases(sw, batches, kvlens)
    if not cases or any(b < 1 or n < 1 for b, n in cases):
        log(f"decode: batches and KV lengths must be >= 1, got cases {list(cases)}")
        return []
    dtype = DTYPES[dtype_name]
    env = _env_cached()
    names = list(provider_names or sw.providers)
    if device == "cuda" and "ioattn" in names and "ioattn-graph" not in names:
        names.insert(names.index("ioattn") + 1, "ioattn-graph")  # ioattn always comes with its graph replay
    table = decode_providers(names)
    records = _Records(sink, env)
    for pname, (setup, why) in table.items():
        if setup is None:
            log(f"{pname}: skipped ({why})")
            for d in sw.headdims:
                records.append(_decode_record(name, pname, dtype_name, (*cases[0], sw.nheads, sw.nheads_kv, d), env,
                                              ok=False, error=why))
    runnable = {p: setup for p, (setup, _) in table.items() if setup is not None}
    bar = _Progress(len(sw.headdims) * len(cases) * len(runnable))
    with torch.no_grad():
        for d in sw.headdims:
            checked = {}
            for batch, kvlen in cases:
                shape = (batch, kvlen, sw.nheads, sw.nheads_kv, d)
                try:
                    n_sets = n_input_sets(decode_bytes(batch, kvlen, sw.nheads_kv, d, dtype.itemsize))
                    sets = [_decode_inputs(shape, dtype, device) for _ in range(n_sets)]
                except torch.cuda.OutOfMemoryError:
                    log(f"d={d} batch={batch} kv={kvlen}: inputs do not fit in device memory; skipping this case")
                    continue
                prepared = {}  # provider -> (ok, err, its runs on every input set)
                for pname, setup in runnable.items():
                    bar.step(f"{pname} d={d} batch={batch} kv={kvlen}")
                    try:
                        if pname not in checked:  # correctness on the first case, at a small batch
                            checked[pname] = _check_decode(setup, sets[0])
                        prepared[pname] = (*checked[pname], [setup(*s) for s in sets])
                    except Exception as e:  # noqa: BLE001 - a provider that cannot run a case is reported
                        _decode_failed(records, log, name, pname, dtype_name, shape, env, e)
                times, host = {p: [] for p in prepared}, {}
                order = list(prepared)
                for r in range(max(1, rounds) if order else 0):
                    for pname in order[r % len(order):] + order[:r % len(order)]:
                        if pname not in times:
                            continue
                        try:
                            stats = {}
                            times[pname].append(median_ms(lambda run: run(), prepared[pname][2], stats=stats))
                            host.setdefault(pname, stats.get("host_ms"))
                        except Exception as e:  # noqa: BLE001
                            _decode_failed(records, log, name, pname, dtype_name, shape, env, e)
                            del times[pname]
                for pname in order:
                    if pname not in times:
                        continue
                    ok, err, _ = prepared[pname]
                    rec = _decode_record(name, pname, dtype_name, shape, env, ms=statistics.median(times[pname]),
                                         ok=ok, max_err=err, host_ms=host.get(pname))
                    rec["ms_rounds"] = times[pname]
                    if not ok:
                        rec["error"] = f"failed the correctness check (max err {err:.3g})"
                    records.append(rec)
                    log(_decode_line(rec))
                del prepared
                if device == "cuda":
                    torch.cuda.empty_cache()
                del sets
    bar.close()
    return list(records)


def _decode_failed(records, log, name, pname, dtype_name, shape, env, e):
    msg = _short(e)
    records.append(_decode_record(name, pname, dtype_name, shape, env, ok=False, error=msg))
    log(f"{pname} d={shape[4]} batch={shape[0]} kv={shape[1]}: cannot run ({msg})")


def _decode_inputs(shape, dtype, device):
    """(q, k_cache, v_cache, cache_seqlens): normal random values, every cache full."""
    batch, kvlen, nheads, nheads_kv, d = shape
    q = torch.randn(batch, 1, nheads, d, device=device, dtype=dtype)
    k = torch.randn(batch, kvlen, nheads_kv, d, device=device, dtype=dtype)
    v = torch.randn(batch, kvlen, nheads_kv, d, device=device, dtype=dtype)
    return q, k, v, torch.full((batch,), kvlen, dtype=torch.int32, device=device)


def _check_decode(setup, inputs):
    """A provider's output vs the float64 oracle, against PyTorch's own same-dtype error (as
    ``_check``), on the first ``DECODE_CHECK_BATCH`` sequences of ``inputs``."""
    q, k, v, seqlens = (t[:DECODE_CHECK_BATCH] for t in inputs)
    ref, _ = kvcache_attention_ref(q, k, v, cache_seqlens=seqlens)
    same, _ = kvcache_attention_ref(q, k, v, cache_seqlens=seqlens, upcast=False)
    out = setup(q, k, v, seqlens)()
    err = (out.double() - ref).abs().max().item()
    base = (same.double() - ref).abs().max().item()
    return (not math.isnan(err)) and err <= 2 * base + 1e-4, err


def _decode_record(sweep, provider, dtype, shape, env, ms=None, ok=False, max_err=None, error=None, host_ms=None):
    batch, kvlen, nheads, nheads_kv, d = shape
    gbps = decode_bytes(batch, kvlen, nheads_kv, d, DTYPES[dtype].itemsize) / ms / 1e6 if ms and ok else None
    rec = {"sweep": sweep, "provider": provider, "dtype": dtype, "batch": batch, "nheads": nheads,
           "nheads_kv": nheads_kv, "headdim": d, "seqlen_q": 1, "seqlen_k": kvlen, "causal": False,
           "paged": provider == "ioattn-paged", "device": env["device"], "mode": "decode", "ms": ms,
           "us": None if ms is None else ms * 1e3, "gbps": gbps, "ok": ok}
    if max_err is not None:
        rec["max_err"] = max_err
    if host_ms is not None:
        rec["host_ms"] = host_ms
    if error:
        rec["error"] = error
    return rec


def _decode_line(r):
    value = f"{r['gbps']:8.4g} GB/s" if r.get("gbps") is not None else "   (failed)  "
    us = f"{r['us']:9.1f} us" if r.get("us") is not None else " " * 12
    return f"{r['provider']:<15} decode d={r['headdim']:<3} batch={r['batch']:<3} kv={r['seqlen_k']:<7} {us} {value}"


_ENV = None


def _env_cached():
    global _ENV
    if _ENV is None:
        _ENV = environment()
    return _ENV


def _base(sweep, provider, dtype, shape, causal, env, **extra):
    batch, n, nheads, d = shape
    rec = dict(sweep=sweep, provider=provider, dtype=dtype, batch=batch, nheads=nheads, nheads_kv=nheads,
               headdim=d, seqlen_q=n, seqlen_k=n, causal=causal, paged=False, device=env["device"],
               ms=None, tflops=None)
    rec.update(extra)
    return rec


def _short(e):
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}"


def _time_rounds(runnable, checked, sets, causal, modes, rounds, records, log, base):
    """Time every provider in ``checked`` (name -> (ok, err)) at one point, every mode, in ``rounds``
    interleaved rounds: round r starts at provider r, so no provider always runs first or after the
    same one (the decode sweep's scheme). A record's time is the median of its rounds' medians
    (``ms_rounds`` lists them). A provider that fails in some round is reported once and dropped."""
    order = list(checked)
    times = {p: {m: [] for m in modes} for p in order}
    host = {}
    for r in range(max(1, rounds)):
        for pname in order[r % len(order):] + order[:r % len(order)]:
            if pname not in times:
                continue
            try:
                for mode in modes:
                    stats = {}
                    times[pname][mode].append(_time(runnable[pname], sets, causal, mode, stats))
                    host.setdefault((pname, mode), stats.get("host_ms"))
            except Exception as e:  # noqa: BLE001 - a provider that cannot run a shape is reported
                _train_failed(records, log, base["sweep"], pname, base["dtype"], base["shape"], causal, base["env"],
                              modes[0], e)
                del times[pname]
    for pname in order:
        if pname not in times:
            continue
        ok, err = checked[pname]
        batch, n, nheads, d = base["shape"]
        for mode in modes:
            ms = statistics.median(times[pname][mode])
            tf = attention_flops(batch, nheads, n, n, d, causal, mode) / ms / 1e9
            rec = _base(base["sweep"], pname, base["dtype"], base["shape"], causal, base["env"], mode=mode,
                        ms=ms, tflops=tf if ok else None, ok=ok, max_err=err, host_ms=host.get((pname, mode)))
            rec["ms_rounds"] = times[pname][mode]
            if not ok:
                rec["error"] = f"failed the correctness check (max err {err:.3g})"
            records.append(rec)
            log(_line(rec))


def _train_failed(records, log, name, pname, dtype_name, shape, causal, env, mode, e):
    msg = _short(e)
    records.append(_base(name, pname, dtype_name, shape, causal, env, mode=mode, ok=False, error=msg))
    log(f"{pname} d={shape[3]} n={shape[1]} causal={int(causal)}: cannot run ({msg})")


def _measure_memory(fn, qkv, causal, base):
    """Peak device memory of one forward+backward above the inputs (q, k, v, dout stay allocated)."""
    q, k, v = (t.detach().requires_grad_() for t in qkv)
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    out = fn(q, k, v, causal)
    torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - start) / 2**20
    return _base(base["sweep"], base["provider"], base["dtype"], base["shape"], causal, base["env"],
                 mode="fwdbwd", ok=True, peak_mem_mb=peak)


def _time(fn, sets, causal, mode, stats=None):
    if mode == "fwd":
        with torch.no_grad():
            return median_ms(lambda s: fn(*s, causal), sets, stats=stats)
    if mode == "fwdbwd":
        def step(s):
            q, k, v, dout = s
            torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)
        leaves = [tuple(t.detach().requires_grad_() for t in s) + (torch.randn_like(s[0]),) for s in sets]
        return median_ms(step, leaves, stats=stats)
    graded = []
    for s in sets:
        q, k, v = (t.detach().requires_grad_() for t in s)
        out = fn(q, k, v, causal)
        graded.append((out, torch.randn_like(out), (q, k, v)))
    return median_ms(lambda g: torch.autograd.grad(g[0], g[2], g[1], retain_graph=True), graded, stats=stats)


def _line(r):
    if r.get("peak_mem_mb") is not None:
        value = f"{r['peak_mem_mb']:10.1f} MB peak"
    else:
        value = f"{r['tflops']:7.3g} TFLOP/s" if r.get("tflops") is not None else "   (failed)    "
    ms = f"{r['ms']:9.3f} ms" if r.get("ms") is not None else " " * 12
    return (f"{r['provider']:<15} {r['mode']:<6} d={r['headdim']:<3} n={r['seqlen_q']:<6} "
            f"causal={int(r['causal'])} {ms} {value}")


class _Records(list):
    def __init__(self, sink, env, layout=None):
        super().__init__()
        self.sink, self.env, self.layout = sink, env, layout

    def append(self, rec):
        rec.setdefault("env", self.env)
        if self.layout is not None:
            rec.setdefault("layout", self.layout)
        super().append(rec)
        if self.sink is not None:
            self.sink(rec)


def main(argv=None):
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        from ioattn.bench.report import main as report_main
        return report_main(argv[1:])
    ap = argparse.ArgumentParser(prog="ioattn bench", description="Benchmark ioattn against its peers.")
    ap.add_argument("sweep", nargs="?", default="quick",
                    help="train | memory | quick | decode (or: report RESULTS.jsonl)")
    ap.add_argument("--dtype", default="bf16", help="bf16 | fp16")
    ap.add_argument("--providers", default=None, help="comma-separated provider names")
    ap.add_argument("--headdims", default=None, help="comma-separated subset of the sweep's head dims")
    ap.add_argument("--seqlens", default=None, help="comma-separated sequence lengths (longer ones on request); "
                    "for decode, the same as --kvlens")
    ap.add_argument("--batches", default=None, help="decode: comma-separated batch sizes (with --kvlens: their "
                    "cross product replaces the case list; default 1)")
    ap.add_argument("--kvlens", default=None, help="decode: comma-separated KV lengths (default: the sweep's)")
    ap.add_argument("--rounds", type=int, default=None, help=f"interleaved timing rounds per point, the median of "
                    f"their medians reported (default {DECODE_ROUNDS} for decode, {TIME_ROUNDS} for the other "
                    f"timed sweeps on a GPU, 1 on the CPU)")
    ap.add_argument("--layout", default="separate", choices=LAYOUTS,
                    help="memory layout of q, k, v for the training sweeps: three tensors, the views of one "
                         "packed (batch, seqlen, 3, heads, d) tensor (as flash_attn_qkvpacked_func takes them), "
                         "or three (batch, heads, seqlen, d) tensors transposed")
    ap.add_argument("--out", default=None, help="directory for results.jsonl and the plots")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("No GPU found: these are CPU figures (ioattn's tiled CPU path against PyTorch's CPU attention).")
    names = args.providers.split(",") if args.providers else None
    ceil = ceilings(device)
    if ceil:
        print(f"ceilings: bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s, "
              f"d2d copy {ceil['d2d_copy_gbps']:.0f} GB/s")
    sink_file = path = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "results.jsonl")
        sink_file = open(path, "w")
    command = "ioattn bench " + " ".join(argv)

    def sink(rec):
        rec["ceilings"] = ceil
        rec["command"] = command
        if sink_file:
            sink_file.write(json.dumps(rec) + "\n")
            sink_file.flush()

    ints = lambda s: [int(x) for x in s.split(",")] if s else None  # noqa: E731
    records = run_sweep(args.sweep, device, args.dtype, names, log=lambda s: print(s, flush=True), sink=sink,
                        headdims=ints(args.headdims), seqlens=ints(args.seqlens), batches=ints(args.batches),
                        kvlens=ints(args.kvlens), rounds=args.rounds, layout=args.layout)
    from ioattn.bench.report import plot, table
    print()
    print(table(records))
    if sink_file:
        sink_file.close()
        print(f"\nwrote {len(records)} records to {path}")
        try:
            for p in plot(records, args.out):
                print(f"wrote {p}")
        except ImportError:  # matplotlib is the optional [bench] extra; the JSON is what matters
            print("no plots: matplotlib is not installed (pip install 'ioattn[bench]')")
    ours = [r for r in records if r["provider"].startswith("ioattn")]
    return 0 if ours and all(r.get("ok") for r in ours) else 1
