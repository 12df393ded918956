"""``ioattn bench``: every provider side by side, correctness first, one JSON line per measurement.

Sweeps (``SWEEP_HELP``; the command line is ``ioattn.cli``): ``train`` (forward, backward,
forward+backward on the papers' grid; GPU only), ``memory`` (peak memory of forward+backward
against sequence length), ``quick`` (a short default; on a machine without a GPU, the CPU path
against PyTorch's CPU attention), ``decode`` (one query token per sequence over a full KV cache,
32 query heads / 8 KV heads, d 128, on the (batch, KV length) cases of ``DECODE_CASES``; GB/s of K
and V read; ``ioattn`` also replayed from a CUDA graph as ``ioattn-graph``; on a machine without a
GPU, small sizes against PyTorch's CPU attention), ``mla`` (the decode sweep at MLA's shape: 128
query heads over one latent cache of 576 columns, V its first 512, read once), ``latency`` (eager calls one at a time,
synchronised: per-call latency as ``ms`` and the call's host time as ``host_ms``; the papers' grid
from N = 512 against cuDNN and SDPA flash).

Every timed sweep first checks each provider against the float64 oracle (``verdict``) and logs one
verdict line per provider and configuration; a provider that fails is still timed, its records
marked not ok.
"""
from __future__ import annotations

import hashlib
import math
import pathlib
import platform
import statistics
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ioattn.bench import verdict
from ioattn.bench.memory import peak_bytes
from ioattn.bench.progress import Progress
from ioattn.bench.providers import decode_providers, providers
from ioattn.bench.timing import attention_flops, latency_ms, median_ms, n_input_sets
from ioattn.reference import attention_ref
from ioattn.reference.decode import kvcache_attention_ref

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# How q, k, v are laid out in memory, the same for every provider: "separate" (three contiguous
# tensors), "qkvpacked" (the views ``qkv.unbind(2)`` of one (batch, seqlen, 3, heads, d) tensor, as
# a fused QKV projection produces them and flash_attn_qkvpacked_func takes them) or "bhnd" (three
# (batch, heads, seqlen, d) tensors, SDPA's order, transposed to flash-attn's).
LAYOUTS = ("separate", "qkvpacked", "bhnd")
ALL_PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex", "flash-attn", "flash-attn-cute")


def default_dtype(device):
    """bf16 on a GPU (the papers' figures); fp32 on the CPU, the type CPU models run in."""
    return "bf16" if device == "cuda" else "fp32"


@dataclass(frozen=True)
class Sweep:
    headdims: tuple
    seqlens: tuple
    causal: tuple = (False, True)
    modes: tuple = ("fwd", "bwd", "fwdbwd")
    tokens: int = 16384  # batch * seqlen, as the FlashAttention papers plot it; 0: batch 1
    hidden: int = 2048   # nheads * headdim
    providers: tuple = ("ioattn", "ioattn-ptr", "ioattn-hopper") + ALL_PEERS
    memory: bool = False  # peak memory of forward+backward instead of time
    latency: bool = False  # eager calls one at a time, synchronised (timing.latency_ms), instead of device time


PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
GPU_SWEEPS = {
    "train": Sweep(headdims=(64, 128, 256), seqlens=PAPER_SEQLENS),
    "quick": Sweep(headdims=(64, 128), seqlens=(1024, 4096, 16384), modes=("fwd", "bwd"),
                   providers=("ioattn", "sdpa-flash", "sdpa-cudnn")),
    # what a caller timing eager calls one at a time sees: host time and synchronised latency
    "latency": Sweep(headdims=(64, 128), seqlens=(512, 1024, 2048, 4096), modes=("fwd", "bwd"),
                     providers=("ioattn", "sdpa-cudnn", "sdpa-flash"), latency=True),
    # the FP8 forward (inputs quantised per head outside the timed calls) beside our bf16 forward and cuDNN's
    "fp8": Sweep(headdims=(64, 128, 256), seqlens=PAPER_SEQLENS, modes=("fwd",),
                 providers=("ioattn-fp8", "ioattn-fp8-call", "ioattn-fp8-portable", "ioattn",
                            "sdpa-cudnn", "sageattn")),
    # one sequence of 16 heads of dim 128, doubling until standard attention no longer fits
    "memory": Sweep(headdims=(128,), seqlens=tuple(2**i for i in range(10, 18)), causal=(False,),
                    modes=("fwdbwd",), tokens=0, providers=("ioattn", "sdpa-math"), memory=True),
}
# Without a GPU: the CPU path (ioattn.kernels.cpu) against PyTorch's CPU attention, one sequence of 8
# heads of dim 64: PyTorch's default (its flash kernel) and its standard attention (math).
CPU_SWEEPS = {
    "quick": Sweep(headdims=(64,), seqlens=(512, 1024, 2048), tokens=0, hidden=512, modes=("fwd", "bwd"),
                   providers=("ioattn", "sdpa", "sdpa-math")),
    "memory": Sweep(headdims=(64,), seqlens=(512, 1024, 2048), causal=(False,), modes=("fwdbwd",), tokens=0,
                    hidden=512, providers=("ioattn", "sdpa", "sdpa-math"), memory=True),
    "latency": Sweep(headdims=(64,), seqlens=(128, 512), tokens=0, hidden=512, modes=("fwd", "bwd"),
                     providers=("ioattn", "sdpa"), latency=True),
}


@dataclass(frozen=True)
class DecodeSweep:
    """One query token per sequence; every sequence fills its cache (cache_seqlens = capacity = kvlen).
    ``headdim_v``: V's head dim (0: each head dim's own); ``latent``: V is the first ``headdim_v``
    columns of K's storage (MLA's latent cache), so its bytes are K's."""
    cases: tuple  # (batch, kvlen) pairs
    nheads: int = 32
    nheads_kv: int = 8
    headdims: tuple = (128,)
    providers: tuple = ("ioattn", "ioattn-graph", "ioattn-checked", "ioattn-paged", "ioattn-unified", "ioattn-nopdl",
                        "ioattn-graph-nopdl", "ioattn-fp8") + ALL_PEERS + ("flashinfer", "flashinfer-fp8")
    headdim_v: int = 0
    latent: bool = False


class DecodeShape(NamedTuple):
    """One decode case; ``dv`` and ``latent`` as ``DecodeSweep``'s ``headdim_v`` and ``latent``."""
    batch: int
    kvlen: int
    nheads: int
    nheads_kv: int
    d: int
    dv: int = 0
    latent: bool = False

    def kv_bytes(self, itemsize):
        """Bytes of K and V one step reads (V's none where it is K's columns: ``latent``)."""
        v = 0 if self.latent else (self.dv or self.d)
        return self.batch * self.kvlen * self.nheads_kv * (self.d + v) * itemsize


DECODE_CASES = ((1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 8192), (32, 32768), (64, 4096))
# MLA's decoding (DeepSeek-V2/V3): 128 query heads read one latent cache of 512 + 64 rotary columns, V
# its first 512; the target is the share of the device's copy bandwidth its bytes are read at.
MLA_CASES = ((1, 32768), (1, 4096), (8, 8192))
GPU_DECODE = {"decode": DecodeSweep(cases=DECODE_CASES),
              "mla": DecodeSweep(cases=MLA_CASES, nheads=128, nheads_kv=1, headdims=(576,), headdim_v=512, latent=True,
                                 providers=("ioattn", "ioattn-graph", "ioattn-checked", "ioattn-split"))}
DECODE_SWEEPS = tuple(GPU_DECODE)
CPU_DECODE = {"decode": DecodeSweep(cases=((1, 256), (1, 1024), (2, 256), (2, 1024)), nheads=4, nheads_kv=2,
                                    headdims=(64,), providers=("ioattn", "ioattn-paged", "sdpa", "sdpa-math"))}
DECODE_CHECK_BATCH = 2  # the correctness check runs on the first case, cut to at most this batch
# The training sweeps' correctness check runs on the first sequence length of each configuration,
# cut to at most this batch and to as many heads as keep the oracle's score matrix (batch x heads x
# seqlen^2 entries, held several times over in float64 with its gradients) within CHECK_SCORES
# entries, one head at least. Sequences and heads are computed independently, so the cut problem's
# error is the whole one's; uncut, 8 heads at 8192 tokens take 4 GiB per float64 score matrix.
CHECK_BATCH = 2
CHECK_SCORES = 2**26
# Interleaved timing rounds per decode case (``run_decode_sweep``; ``--rounds``): three give a median
# that one outlying round cannot move, at ~3x the timed calls (a case's calls take < 25 ms each round).
DECODE_ROUNDS = 3
# The same for the timed training sweeps (``_time_rounds``), on a GPU and on the CPU alike: with one
# timing per provider in a fixed order, ioattn always ran first at a point, right after the previous
# point's cuDNN forward+backward, and cuDNN right after SDPA flash's: under the H200's power cap the
# clock a timing starts at follows what ran before it, so the order favoured one provider; on a
# shared CPU, one timing that lands beside another job's burst would decide a comparison alone.
TIME_ROUNDS = 3

# One line per sweep, for the command line's help; a sweep without a CPU table needs a GPU.
SWEEP_HELP = {
    "train": "forward, backward and forward+backward time on the FlashAttention papers' grid",
    "memory": "peak memory of one forward+backward against sequence length",
    "quick": "a short run: correctness check, then forward and backward time (the default)",
    "decode": "one query token per sequence over a full KV cache: time and GB/s of K and V read",
    "mla": "the decode sweep at MLA's shape (576 / 512 over one latent KV head, 128 query heads)",
    "latency": "eager calls one at a time, synchronised: per-call latency and host time",
    "fp8": "the FP8 (e4m3) forward beside the bf16 forward: time and TFLOP/s",
}


def sweep_table(name, device):
    """The definition of sweep ``name`` on ``device`` ("cuda" or "cpu"), None where it does not run."""
    tables = (GPU_SWEEPS, GPU_DECODE) if device == "cuda" else (CPU_SWEEPS, CPU_DECODE)
    return next((t[name] for t in tables if name in t), None)


def needs_gpu(name):
    return sweep_table(name, "cpu") is None


def sweeps_on(device):
    """The sweeps that run on ``device``, in ``SWEEP_HELP``'s order."""
    return [n for n in SWEEP_HELP if sweep_table(n, device) is not None]


def decode_bytes(batch, kvlen, nheads_kv, d, itemsize):
    """Bytes of K and V one decode step reads: 2 * batch * kvlen * nheads_kv * d * itemsize (the
    query and output, batch * nheads * d each, are left out)."""
    return 2 * batch * kvlen * nheads_kv * d * itemsize


def environment():
    env = {"python": platform.python_version(), "torch": torch.__version__, "ioattn": source_digest()}
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


def source_digest(root=None):
    """A short hash of the ioattn package's Python sources (those under ``root``, this package's folder
    by default), so that a result names the code it timed: two copies of the package side by side in an
    A/B give two digests."""
    root = pathlib.Path(root) if root is not None else pathlib.Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


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


def _check(fn, q, k, v, causal, grads=False):
    """``fn``'s output (with ``grads``: and its dq, dk, dv) against the float64 oracle, judged against
    PyTorch's own same-dtype error (``verdict``), on the part ``_check_slice`` keeps. Returns a
    ``verdict.Verdict``; its first two fields are (ok, the output's max error)."""
    q, k, v = _check_slice(q, k, v)
    window = (-1, 0) if causal else (-1, -1)
    dout = torch.randn_like(q) if grads else None
    oracle = verdict.outputs(lambda *a: attention_ref(*a, window=window)[0], q.double(), k.double(), v.double(),
                             None if dout is None else dout.double())
    # a provider with a precision of its own (FP8) brings its same-precision twin
    twin = getattr(fn, "same_precision", None)
    same = verdict.outputs((lambda *a: twin(*a, causal)) if twin else
                           (lambda *a: attention_ref(*a, window=window, upcast=False)[0]), q, k, v, dout)
    got = verdict.outputs(lambda *a: fn(*a, causal), q, k, v, dout)
    return verdict.judge(got, oracle, same)


def _check_slice(q, k, v):
    """The first ``CHECK_BATCH`` sequences of q, k, v and, where q and k have the same heads, the
    first heads that keep the score matrix within ``CHECK_SCORES`` entries."""
    b = min(q.shape[0], CHECK_BATCH)
    h = q.shape[2]
    if k.shape[2] == h:
        h = max(1, min(h, CHECK_SCORES // (b * q.shape[1] * k.shape[1])))
    return tuple(t[:b, :, :h] for t in (q, k, v))


def _shape(sw, d, n):
    batch = max(1, sw.tokens // n) if sw.tokens else 1
    return batch, n, max(1, sw.hidden // d), d


def _weight(shape):
    """A point's relative cost, for the estimate of the time left: its score-matrix entries times d."""
    batch, n, nheads, d = shape
    return batch * nheads * n * n * d


def _inputs(shape, dtype, device, layout):
    """One input set (q, k, v) of ``shape`` in ``layout`` (``LAYOUTS``)."""
    batch, n, nheads, d = shape
    if layout == "qkvpacked":
        return torch.randn(batch, n, 3, nheads, d, device=device, dtype=dtype).unbind(2)
    if layout == "bhnd":
        return tuple(torch.randn(batch, nheads, n, d, device=device, dtype=dtype).transpose(1, 2) for _ in range(3))
    return tuple(torch.randn(shape, device=device, dtype=dtype) for _ in range(3))


@dataclass
class _Run:
    """What every point of one training sweep shares."""
    name: str
    sw: Sweep
    device: str
    dtype_name: str
    layout: str
    rounds: int
    env: dict
    records: list
    log: object
    bar: Progress = None
    runnable: dict = None

    def base(self, shape, causal, **extra):
        return dict(sweep=self.name, dtype=self.dtype_name, shape=shape, causal=causal, env=self.env, **extra)


def run_sweep(name, device, dtype_name=None, provider_names=None, log=print, sink=None, headdims=None,
              seqlens=None, batches=None, kvlens=None, rounds=None, layout="separate"):
    """Run one sweep and return its records; every record also goes to ``sink`` as soon as it exists
    (a run cut off by a time limit keeps what it measured). Problems are logged, never raised.
    ``dtype_name``: a key of ``DTYPES``, default ``default_dtype(device)``. ``batches``/``kvlens``
    are for ``decode`` only (``seqlens`` is read as ``kvlens`` there); ``rounds``: interleaved
    timing rounds per point (``_time_rounds``; default ``TIME_ROUNDS``, the decode sweep's
    ``DECODE_ROUNDS``). ``layout``: the inputs' memory layout (``LAYOUTS``; training sweeps only),
    recorded in every record. Progress (with the time left) goes to stderr (``progress``)."""
    dtype_name = dtype_name or default_dtype(device)
    if name in GPU_DECODE:
        if layout != "separate":
            log("--layout is for the training sweeps; ignored")
        return run_decode_sweep(name, device, dtype_name, provider_names, log, sink, headdims,
                                batches, kvlens or seqlens, DECODE_ROUNDS if rounds is None else rounds)
    sw = _training_sweep(name, device, dtype_name, layout, headdims, seqlens, log)
    if sw is None:
        return []
    if batches or kvlens:
        log("--batches/--kvlens are for the decode sweep; ignored")
    env = _env_cached()
    run = _Run(name, sw, device, dtype_name, layout, max(1, TIME_ROUNDS if rounds is None else rounds), env,
               _Records(sink, env, layout), log)
    run.runnable = _runnable(run, providers(provider_names or sw.providers))
    per_point = len(run.runnable) * (1 if sw.memory else run.rounds)
    run.bar = Progress(sum(_weight(_shape(sw, d, n)) * per_point
                           for d in sw.headdims for _ in sw.causal for n in sw.seqlens))
    run.log = run.bar.wrap(log)
    for d in sw.headdims:
        for causal in sw.causal:
            _configuration(run, d, causal)
    run.bar.close()
    return list(run.records)


def _training_sweep(name, device, dtype_name, layout, headdims, seqlens, log):
    """The sweep ``name`` on ``device`` with the caller's head dims and sequence lengths, or None
    (with the reason logged) when it cannot run."""
    sw = (GPU_SWEEPS if device == "cuda" else CPU_SWEEPS).get(name)
    if sw is None:
        here = ", ".join(sweeps_on(device))
        if name in GPU_SWEEPS:
            log(f"sweep {name!r} needs a GPU (none found here); sweeps that run here: {here}")
        else:
            log(f"unknown sweep {name!r} on {device}; known here: {here}")
        return None
    if dtype_name not in DTYPES:
        log(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
        return None
    if layout not in LAYOUTS:
        log(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
        return None
    if headdims:
        sw = replace(sw, headdims=tuple(headdims))
    return replace(sw, seqlens=tuple(seqlens)) if seqlens else sw


def _runnable(run, table):
    """The providers of ``table`` that can run here; the others are logged and recorded once per
    configuration as could-not-run, with the reason."""
    sw = run.sw
    for pname, (fn, why) in table.items():
        if fn is None:
            run.log(f"{pname}: skipped ({why})")
            for d in sw.headdims:
                for causal in sw.causal:
                    run.records.append(_base(run.name, pname, run.dtype_name, _shape(sw, d, sw.seqlens[0]), causal,
                                             run.env, mode=sw.modes[0], ok=False, error=why))
    return {p: fn for p, (fn, _) in table.items() if fn is not None}


def _configuration(run, d, causal):
    """Every sequence length of one (head dim, causal) configuration; each provider checked on the
    first length it runs at."""
    checked = {}
    for n in run.sw.seqlens:
        shape = _shape(run.sw, d, n)
        try:
            count = 1 if run.sw.memory or run.device != "cuda" else n_input_sets(3 * math.prod(shape) * 2)
            sets = [_inputs(shape, DTYPES[run.dtype_name], run.device, run.layout) for _ in range(count)]
        except torch.cuda.OutOfMemoryError:  # (torch.OutOfMemoryError needs torch >= 2.5)
            run.log(f"d={d} n={n}: inputs do not fit in device memory; stopping this configuration")
            return
        if run.sw.memory:
            _memory_point(run, sets[0], shape, causal)
        else:
            timed = _check_point(run, sets[0], shape, causal, checked)
            if timed:
                _time_rounds(run.runnable, timed, sets, causal, run.sw.modes, run.rounds, run.records, run.log,
                             run.base(shape, causal), bar=run.bar, timer=latency_ms if run.sw.latency else median_ms)
        del sets
        _release(run.device)


def _release(device):
    if device == "cuda":
        torch.cuda.empty_cache()


def _check_point(run, inputs, shape, causal, checked):
    """Provider -> its verdict for every provider that runs at this point; the check (and its
    verdict line) once per provider and configuration, at the first length it runs at."""
    timed = {}
    grads = any(m in ("bwd", "fwdbwd") for m in run.sw.modes)
    for pname, fn in run.runnable.items():
        try:
            if pname not in checked:
                checked[pname] = verdict.as_verdict(_check(fn, *inputs, causal, grads=grads))
                run.log(verdict.line(pname, _where(shape, causal), checked[pname]))
            timed[pname] = checked[pname]
        except Exception as e:  # noqa: BLE001 - a provider that cannot run a shape is reported
            _train_failed(run.records, run.log, run.name, pname, run.dtype_name, shape, causal, run.env,
                          run.sw.modes[0], e)
        finally:
            _release(run.device)
    return timed


def _where(shape, causal):
    return f"d={shape[3]} causal={int(causal)} n={shape[1]}"


def _memory_point(run, inputs, shape, causal):
    for pname, fn in run.runnable.items():
        try:
            run.records.append(_measure_memory(fn, inputs, causal, dict(run.base(shape, causal), provider=pname)))
            run.log(_line(run.records[-1]))
        except Exception as e:  # noqa: BLE001 - a provider that cannot run a shape is reported
            _train_failed(run.records, run.log, run.name, pname, run.dtype_name, shape, causal, run.env,
                          run.sw.modes[0], e)
        finally:
            _release(run.device)
            run.bar.step(f"{pname} memory {_where(shape, causal)}", _weight(shape))


def decode_cases(sw, batches=None, kvlens=None):
    """The sweep's (batch, kvlen) cases; when ``batches`` or ``kvlens`` is given, their cross product
    instead (batches default to 1, KV lengths to the sweep's own)."""
    if not batches and not kvlens:
        return tuple(sw.cases)
    ks = tuple(kvlens) if kvlens else tuple(sorted({n for _, n in sw.cases}))
    return tuple((b, n) for b in (tuple(batches) if batches else (1,)) for n in ks)


def run_decode_sweep(name, device, dtype_name=None, provider_names=None, log=print, sink=None, headdims=None,
                     batches=None, kvlens=None, rounds=DECODE_ROUNDS):
    """The decode sweep (see ``run_sweep``): per (head dim, case), every provider is set up on each
    input set outside the timed region, then the providers' ``run()`` are timed with ``median_ms`` in
    ``rounds`` interleaved rounds (round r starts at provider r, so no provider always runs first or
    after the same one); a record's time is the median of its rounds' medians, ``ms_rounds`` lists
    them. Steps of 15-1000 us sit within ~1.5 % of each other from one run to the next on an H200:
    one timing per provider lets a drift of the machine between two providers' turns decide the
    order of two kernels at the same speed."""
    sw = (GPU_DECODE if device == "cuda" else CPU_DECODE)[name]
    if headdims:
        sw = replace(sw, headdims=tuple(headdims))
    dtype_name = dtype_name or default_dtype(device)
    if dtype_name not in DTYPES:
        log(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
        return []
    cases = decode_cases(sw, batches, kvlens)
    if not cases or any(b < 1 or n < 1 for b, n in cases):
        log(f"decode: batches and KV lengths must be >= 1, got cases {list(cases)}")
        return []
    env = _env_cached()
    names = list(provider_names or sw.providers)
    if device == "cuda" and "ioattn" in names and "ioattn-graph" not in names:
        names.insert(names.index("ioattn") + 1, "ioattn-graph")  # ioattn always comes with its graph replay
    records = _Records(sink, env)
    runnable = _decode_runnable(decode_providers(names), sw, cases, name, dtype_name, env, records, log)
    itemsize = DTYPES[dtype_name].itemsize
    bar = Progress(sum(_decode_shape(sw, b, n, d).kv_bytes(itemsize) for d in sw.headdims for b, n in cases)
                   * len(runnable) * max(1, rounds))
    log = bar.wrap(log)
    with torch.no_grad():
        for d in sw.headdims:
            checked = {}
            for batch, kvlen in cases:
                shape = _decode_shape(sw, batch, kvlen, d)
                _decode_case(runnable, checked, shape, device, dtype_name, env, records, log, bar, rounds, name)
    bar.close()
    return list(records)


def _decode_shape(sw, batch, kvlen, d):
    return DecodeShape(batch, kvlen, sw.nheads, sw.nheads_kv, d, sw.headdim_v, sw.latent)


def _decode_runnable(table, sw, cases, name, dtype_name, env, records, log):
    """The decode providers that can run here; the others logged and recorded as could-not-run."""
    for pname, (setup, why) in table.items():
        if setup is None:
            log(f"{pname}: skipped ({why})")
            for d in sw.headdims:
                records.append(_decode_record(name, pname, dtype_name, _decode_shape(sw, *cases[0], d), env,
                                              ok=False, error=why))
    return {p: setup for p, (setup, _) in table.items() if setup is not None}


def _decode_case(runnable, checked, shape, device, dtype_name, env, records, log, bar, rounds, name):
    """One (head dim, case): inputs, each provider checked (once per head dim) and set up, then timed
    in interleaved rounds and recorded."""
    batch, kvlen, _, nheads_kv, d = shape[:5]
    dtype = DTYPES[dtype_name]
    try:
        n_sets = 1 if device != "cuda" else n_input_sets(shape.kv_bytes(dtype.itemsize))
        sets = [_decode_inputs(shape, dtype, device) for _ in range(n_sets)]
    except torch.cuda.OutOfMemoryError:
        log(f"d={d} batch={batch} kv={kvlen}: inputs do not fit in device memory; skipping this case")
        return
    prepared = {}  # provider -> (its verdict, its runs on every input set)
    for pname, setup in runnable.items():
        try:
            if pname not in checked:  # correctness on the first case, at a small batch
                checked[pname] = verdict.as_verdict(_check_decode(setup, sets[0]))
                log(verdict.line(pname, f"d={d} batch={min(batch, DECODE_CHECK_BATCH)} kv={kvlen}", checked[pname]))
            prepared[pname] = (checked[pname], [setup(*s) for s in sets])
        except Exception as e:  # noqa: BLE001 - a provider that cannot run a case is reported
            _decode_failed(records, log, name, pname, dtype_name, shape, env, e)
    times, host = _decode_rounds(prepared, rounds, records, log, name, dtype_name, shape, env, bar)
    for pname in prepared:
        if pname in times:
            v = prepared[pname][0]
            rec = _decode_record(name, pname, dtype_name, shape, env, ms=statistics.median(times[pname]),
                                 ok=v.ok, max_err=v.err, host_ms=host.get(pname))
            rec.update(v.fields())
            rec["ms_rounds"] = times[pname]
            if not v.ok:
                rec["error"] = v.failure()
            records.append(rec)
            log(_decode_line(rec))
    del prepared, sets
    _release(device)


def _decode_rounds(prepared, rounds, records, log, name, dtype_name, shape, env, bar):
    """(provider -> its rounds' times, provider -> host ms of a call); a provider that fails in a
    round is recorded and left out of the rest."""
    times, host = {p: [] for p in prepared}, {}
    order = list(prepared)
    weight = shape.kv_bytes(DTYPES[dtype_name].itemsize)
    for r in range(max(1, rounds) if order else 0):
        for pname in order[r % len(order):] + order[:r % len(order)]:
            if pname not in times:
                continue
            try:
                stats = {}
                times[pname].append(median_ms(lambda run: run(), prepared[pname][1], stats=stats))
                host.setdefault(pname, stats.get("host_ms"))
            except Exception as e:  # noqa: BLE001
                _decode_failed(records, log, name, pname, dtype_name, shape, env, e)
                del times[pname]
            bar.step(f"{pname} decode d={shape[4]} batch={shape[0]} kv={shape[1]}", weight)
    return times, host


def _decode_failed(records, log, name, pname, dtype_name, shape, env, e):
    msg = _short(e)
    records.append(_decode_record(name, pname, dtype_name, shape, env, ok=False, error=msg))
    log(f"{pname} d={shape[4]} batch={shape[0]} kv={shape[1]}: cannot run ({msg})")


def _decode_inputs(shape, dtype, device):
    """(q, k_cache, v_cache, cache_seqlens): normal random values, every cache full; a latent shape's
    v_cache is the view of k_cache's first columns."""
    batch, kvlen, nheads, nheads_kv, d = shape[:5]
    dv = shape.dv or d
    q = torch.randn(batch, 1, nheads, d, device=device, dtype=dtype)
    k = torch.randn(batch, kvlen, nheads_kv, d, device=device, dtype=dtype)
    v = k[..., :dv] if shape.latent else torch.randn(batch, kvlen, nheads_kv, dv, device=device, dtype=dtype)
    return q, k, v, torch.full((batch,), kvlen, dtype=torch.int32, device=device)


def _check_decode(setup, inputs):
    """A provider's output vs the float64 oracle, against PyTorch's own same-dtype error (as
    ``_check``), on the first ``DECODE_CHECK_BATCH`` sequences of ``inputs``."""
    q, k, v, seqlens = (t[:DECODE_CHECK_BATCH] for t in inputs)
    ref, _ = kvcache_attention_ref(q, k, v, cache_seqlens=seqlens)
    twin = getattr(setup, "same_precision", None)  # a provider with a precision of its own (an FP8 cache)
    same = twin(q, k, v, seqlens) if twin else kvcache_attention_ref(q, k, v, cache_seqlens=seqlens, upcast=False)[0]
    return verdict.judge({"out": setup(q, k, v, seqlens)()}, {"out": ref}, {"out": same})


def _decode_record(sweep, provider, dtype, shape, env, ms=None, ok=False, max_err=None, error=None, host_ms=None):
    batch, kvlen, nheads, nheads_kv, d = shape[:5]
    gbps = shape.kv_bytes(DTYPES[dtype].itemsize) / ms / 1e6 if ms and ok else None
    rec = {"sweep": sweep, "provider": provider, "dtype": dtype, "batch": batch, "nheads": nheads,
           "nheads_kv": nheads_kv, "headdim": d, "seqlen_q": 1, "seqlen_k": kvlen, "causal": False,
           "paged": provider == "ioattn-paged", "device": env["device"], "mode": "decode", "ms": ms,
           "us": None if ms is None else ms * 1e3, "gbps": gbps, "ok": ok}
    if shape.dv and shape.dv != d:
        rec["headdim_v"] = shape.dv
    if shape.latent:
        rec["latent"] = True  # V is K's first headdim_v columns: gbps counts K's bytes alone
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


def _time_rounds(runnable, checked, sets, causal, modes, rounds, records, log, base, bar=None, timer=median_ms):
    """Time every provider in ``checked`` (name -> its ``verdict.Verdict``, or an (ok, err) pair) at
    one point, every mode, in ``rounds`` interleaved rounds: round r starts at provider r, so no
    provider always runs first or after the same one (the decode sweep's scheme). A record's time is
    the median of its rounds' medians (``ms_rounds`` lists them). A provider that fails in some round
    is reported once and dropped. ``bar``: a ``Progress`` stepped once per provider and round.
    ``timer``: ``timing.median_ms`` (device time) or ``timing.latency_ms`` (calls one at a time)."""
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
                    times[pname][mode].append(_time(runnable[pname], sets, causal, mode, stats, timer))
                    if stats.get("host_ms") is not None:
                        host.setdefault((pname, mode), []).append(stats["host_ms"])
            except Exception as e:  # noqa: BLE001 - a provider that cannot run a shape is reported
                _train_failed(records, log, base["sweep"], pname, base["dtype"], base["shape"], causal, base["env"],
                              modes[0], e)
                del times[pname]
            if bar is not None:
                bar.step(f"{pname} {_where(base['shape'], causal)} round {r + 1}/{max(1, rounds)}",
                         _weight(base["shape"]))
    for pname in order:
        if pname in times:
            _timed_records(pname, verdict.as_verdict(checked[pname]), times[pname], host, records, log, base, causal)


def _timed_records(pname, v, times, host, records, log, base, causal):
    """One record per mode for ``pname``: the median of its rounds, its verdict's fields."""
    batch, n, nheads, d = base["shape"]
    for mode, ms_rounds in times.items():
        ms = statistics.median(ms_rounds)
        tf = attention_flops(batch, nheads, n, n, d, causal, mode) / ms / 1e9
        rec = _base(base["sweep"], pname, base["dtype"], base["shape"], causal, base["env"], mode=mode,
                    ms=ms, tflops=tf if v.ok else None, ok=v.ok,
                    host_ms=statistics.median(host[pname, mode]) if (pname, mode) in host else None)
        rec.update(v.fields())
        rec["ms_rounds"] = ms_rounds
        if not v.ok:
            rec["error"] = v.failure()
        records.append(rec)
        log(_line(rec))


def _train_failed(records, log, name, pname, dtype_name, shape, causal, env, mode, e):
    msg = _short(e)
    records.append(_base(name, pname, dtype_name, shape, causal, env, mode=mode, ok=False, error=msg))
    log(f"{pname} d={shape[3]} n={shape[1]} causal={int(causal)}: cannot run ({msg})")


def _measure_memory(fn, qkv, causal, base):
    """Peak memory of one forward+backward above the inputs (q, k, v, dout stay allocated):
    ``memory.peak_bytes`` (the allocator's counters on a GPU, the profiler's allocation events on
    the CPU)."""
    q, k, v = (t.detach().requires_grad_() for t in qkv)
    dout = torch.randn_like(q)
    peak = peak_bytes(lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout), q.device) / 2**20
    return _base(base["sweep"], base["provider"], base["dtype"], base["shape"], causal, base["env"],
                 mode="fwdbwd", ok=True, peak_mem_mb=peak)


def _time(fn, sets, causal, mode, stats=None, timer=median_ms):
    if mode == "fwd":
        with torch.no_grad():
            return timer(lambda s: fn(*s, causal), sets, stats=stats)
    if mode == "fwdbwd":
        def step(s):
            q, k, v, dout = s
            torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout)
        leaves = [tuple(t.detach().requires_grad_() for t in s) + (torch.randn_like(s[0]),) for s in sets]
        return timer(step, leaves, stats=stats)
    graded = []
    for s in sets:
        q, k, v = (t.detach().requires_grad_() for t in s)
        out = fn(q, k, v, causal)
        graded.append((out, torch.randn_like(out), (q, k, v)))
    return timer(lambda g: torch.autograd.grad(g[0], g[2], g[1], retain_graph=True), graded, stats=stats)


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
    """``ioattn bench ARGS``: the command line of ``ioattn.cli`` with ``bench`` in front."""
    import sys

    from ioattn.cli import main as cli_main
    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])
