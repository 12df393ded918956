"""The bytes a call actually moves through HBM: Nsight Compute's DRAM counters around one call.

``measure(problem, impl, direction)`` starts this module as a child process under ``ncu`` (profiling
only between ``torch.cuda.profiler.start()`` and ``stop()``: one call, after a warm-up), and sums
``dram__bytes_read.sum`` and ``dram__bytes_write.sum`` over every kernel of that call. ``impl``:
"ioattn" (the dispatched kernels) or "math" (PyTorch's standard attention, S and P in HBM).
``direction``: "forward" or "backward" (the backward alone: its forward runs before the profiled
region). ``tiles``: (block_m, block_n) of ioattn's portable kernels in every pass (``dispatch.set_tile_override``,
the head dim's warps and stages), for a sweep of the model's tile sizes on the kernels; None: the
dispatched kernels at their own tiles. ``ioattn io --measure`` puts the results beside the model's rows.
"""
from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
IMPLS = ("ioattn", "math")
DIRECTIONS = ("forward", "backward")
UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}


class MeasureError(RuntimeError):
    """Nsight Compute is missing, the child failed, or its report held no kernel."""


def ncu_path() -> str | None:
    """The ``ncu`` executable on PATH, or None."""
    return shutil.which("ncu")


def child_args(problem, impl, direction, tiles=None) -> list[str]:
    """The child's command line for ``problem`` (an ``io_model.Problem``)."""
    args = ["--impl", impl, "--direction", direction, "--seqlen", str(problem.seqlen_q), "--seqlen-k",
            str(problem.seqlen_k), "--headdim", str(problem.headdim), "--batch", str(problem.batch), "--nheads",
            str(problem.nheads), "--nheads-kv", str(problem.nheads_kv), "--dtype", problem.dtype]
    if tiles is not None:
        args += ["--tiles", f"{tiles[0]},{tiles[1]}"]
    return args + (["--causal"] if problem.causal else [])


def ncu_command(ncu, args) -> list[str]:
    """``ncu`` profiling the child (``args``: ``child_args``) between its profiler start and stop."""
    return [ncu, "--csv", "--profile-from-start", "off", "--target-processes", "all", "--metrics", ",".join(METRICS),
            sys.executable, "-m", "ioattn.bench.io_measure", *args]


def parse_report(text) -> dict:
    """{"read", "written", "bytes", "kernels"} summed over the kernels of ``ncu --csv``'s report (one row a
    kernel and metric; the values in the unit the row names, thousands separated by commas)."""
    start = text.find('"ID"')
    if start < 0:
        raise MeasureError("no kernel in Nsight Compute's report:\n" + text[-2000:])
    totals, kernels = {m: 0.0 for m in METRICS}, set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = row.get("Metric Name")
        if name not in totals:
            continue
        unit = (row.get("Metric Unit") or "byte").strip().lower()
        if unit not in UNITS:
            raise MeasureError(f"unexpected unit {unit!r} for {name}")
        totals[name] += float(row["Metric Value"].replace(",", "")) * UNITS[unit]
        kernels.add(row["ID"])
    if not kernels:
        raise MeasureError("no kernel in Nsight Compute's report:\n" + text[-2000:])
    read, written = (round(totals[m]) for m in METRICS)
    return {"read": read, "written": written, "bytes": read + written, "kernels": len(kernels)}


def measure(problem, impl, direction, ncu=None, timeout=600, tiles=None) -> dict:
    """The DRAM bytes of one ``impl`` call in ``direction`` on ``problem``, measured by ``ncu``
    (``tiles``: the portable kernels' (block_m, block_n), ioattn's call only)."""
    if impl not in IMPLS or direction not in DIRECTIONS:
        raise ValueError(f"impl must be one of {IMPLS} and direction one of {DIRECTIONS}, got {impl!r}, {direction!r}")
    ncu = ncu or ncu_path()
    if ncu is None:
        raise MeasureError("Nsight Compute (ncu) is not on PATH (a GPU machine with the CUDA toolkit)")
    args = child_args(problem, impl, direction, tiles if impl == "ioattn" else None)
    proc = subprocess.run(ncu_command(ncu, args), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise MeasureError(f"ncu exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return parse_report(proc.stdout)


# ---- the child: one call between the profiler's start and stop ----

def _inputs(a, torch):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    g = torch.Generator(device="cuda").manual_seed(0)

    def draw(seqlen, heads):
        return torch.randn(a.batch, seqlen, heads, a.headdim, device="cuda", dtype=dtype, generator=g,
                           requires_grad=a.direction == "backward")
    return draw(a.seqlen, a.nheads), draw(a.seqlen_k, a.nheads_kv), draw(a.seqlen_k, a.nheads_kv)


def _call(a, torch):
    import torch.nn.functional as F

    import ioattn

    if a.impl == "ioattn":
        return lambda q, k, v: ioattn.flash_attn_func(q, k, v, causal=a.causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def math(q, k, v):
        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=a.causal, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return math


def _fix_tiles(headdim, block_m, block_n):
    """Every pass of the portable kernels at (block_m, block_n), the head dim's warps and stages."""
    import torch

    from ioattn.plan import dispatch

    for kind in ("fwd", "bwd"):
        base = dispatch.tiles(kind, headdim, torch.device("cuda"))
        dispatch.set_tile_override(kind, dispatch.TileConfig(block_m, block_n, base.num_warps, base.num_stages))


def child(argv=None):
    """Run one call of the parsed problem under the profiler (warm-up first: compiles stay outside)."""
    import torch

    ap = argparse.ArgumentParser()
    for name in ("--seqlen", "--seqlen-k", "--headdim", "--batch", "--nheads", "--nheads-kv"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--impl", choices=IMPLS, required=True)
    ap.add_argument("--direction", choices=DIRECTIONS, required=True)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tiles", default=None, help="block_m,block_n of the portable kernels' every pass")
    a = ap.parse_args(argv)
    if a.tiles:
        _fix_tiles(a.headdim, *map(int, a.tiles.split(",")))
    q, k, v = _inputs(a, torch)
    fn = _call(a, torch)
    if a.direction == "forward":
        fn(q, k, v)  # warm-up: compiles and caches stay outside the profiled call
        run = lambda: fn(q, k, v)  # noqa: E731
    else:
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))  # warm-up
        out = fn(q, k, v)  # the backward's forward, outside the profiled region
        dout = torch.ones_like(out)
        run = lambda: torch.autograd.grad(out, (q, k, v), dout)  # noqa: E731
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(child())
