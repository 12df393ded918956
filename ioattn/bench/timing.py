"""Timing rules shared by every sweep: on a GPU device events, warm-up excluded, median of 20 runs,
input sets rotated so that repeated runs do not measure the L2 cache. On the CPU: wall-clock time,
as many runs as fill ``CPU_TARGET_MS`` (at least ``CPU_MIN_REPS``), so that a point's cost stays
bounded whether one call takes 1 ms or 1 s."""
from __future__ import annotations

import math
import statistics
import time

import torch

L2_BYTES = 60 * 2**20  # H200: 60 MB (torch.cuda.get_device_properties reports it; constant for CPU runs)
# CPU: the timed runs of one median fill about this much wall-clock time ...
CPU_TARGET_MS = 300.0
# ... with at least this many runs, so that the median is never a single call's time.
CPU_MIN_REPS = 3


def n_input_sets(bytes_per_set: int) -> int:
    """Enough distinct input sets that cycling through them streams > 3x the L2 cache."""
    return max(1, min(8, -(-3 * L2_BYTES // max(bytes_per_set, 1))))


def cpu_reps(call_ms: float, cap: int = 20) -> int:
    """Timed runs on the CPU for calls of ``call_ms``: enough to fill ``CPU_TARGET_MS``, at least
    ``CPU_MIN_REPS``, at most ``cap``."""
    return max(CPU_MIN_REPS, min(cap, math.ceil(CPU_TARGET_MS / max(call_ms, 1e-3))))


def median_ms(fn_per_set, sets, warmup: int = 3, reps: int = 20, stats: dict | None = None) -> float:
    """Median device time of ``fn(set)`` over ``reps`` runs, rotating through ``sets``.

    On CUDA the timed runs are queued behind a busy-wait kernel long enough to cover their host
    overhead (Python, argument checks, launches), so each event pair brackets the device work of one
    call, not the host's pace in issuing it; every provider is timed the same way. The host time per
    call (measured on the warm-up calls) goes to ``stats["host_ms"]`` when ``stats`` is given: it is
    what an eager caller pays when the device is idle.

    On the CPU one warm-up call is enough (there is nothing to compile or autotune) and its time
    picks the number of timed runs (``cpu_reps``, ``reps`` the most); the median is of wall-clock
    times."""
    if not torch.cuda.is_available():
        return _cpu_median_ms(fn_per_set, sets, reps, stats)
    torch.cuda.synchronize()
    host_ms = 0.0
    for i in range(max(warmup, 1)):
        t0 = time.perf_counter()
        fn_per_set(sets[i % len(sets)])
        host_ms = (time.perf_counter() - t0) * 1e3  # the last warm-up call's (the first may compile)
    if stats is not None:
        stats["host_ms"] = host_ms
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    # ~1.9 GHz SM clock: cycles per ms. 2x the host time of all reps, capped at 200 ms.
    torch.cuda._sleep(int(min(200.0, 2 * reps * host_ms + 1.0) * 1.9e6))
    for i in range(reps):
        starts[i].record()
        fn_per_set(sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _cpu_median_ms(fn_per_set, sets, reps, stats):
    warm = _wall_ms(fn_per_set, sets[0])  # excluded from the median; its time sizes the timed runs
    if stats is not None:
        stats["host_ms"] = warm
    times = [_wall_ms(fn_per_set, sets[(i + 1) % len(sets)]) for i in range(cpu_reps(warm, reps))]
    return statistics.median(times)


def latency_ms(fn_per_set, sets, warmup: int = 3, reps: int = 20, stats: dict | None = None) -> float:
    """Median latency of one eager call made alone, as a caller timing calls one at a time sees it:
    the device idle before each call, the time from issuing it to its result (synchronised).
    ``stats["host_ms"]``: the median time the call took to return (its host time, the device idle
    before). On the CPU both are the wall-clock time of the call (``cpu_reps`` runs)."""
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(max(warmup, 1) if cuda else 1):
        fn_per_set(sets[i % len(sets)])
    sync()
    if not cuda:
        reps = cpu_reps(_wall_ms(fn_per_set, sets[0]), reps)
    host, latency = [], []
    for i in range(reps):
        sync()
        t0 = time.perf_counter()
        fn_per_set(sets[i % len(sets)])
        t1 = time.perf_counter()
        sync()
        latency.append((time.perf_counter() - t0) * 1e3)
        host.append((t1 - t0) * 1e3)
    if stats is not None:
        stats["host_ms"] = statistics.median(host)
    return statistics.median(latency)


def _wall_ms(fn_per_set, s):
    t0 = time.perf_counter()
    fn_per_set(s)
    return (time.perf_counter() - t0) * 1e3


def attention_flops(batch, nheads, seqlen_q, seqlen_k, headdim, causal, mode):
    """Forward 4*B*H*Sq*Sk*D (halved when causal, as the FlashAttention papers count);
    backward 2.5x forward; forward+backward 3.5x."""
    f = 4 * batch * nheads * seqlen_q * seqlen_k * headdim
    if causal:
        f //= 2
    return {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[mode] * f
