"""Compile the Gluon Hopper forward for sm_90 without a GPU (as compile_check.py does for the Triton
kernels): every variant (``ioattn.hopper.VARIANTS``: base, pingpong, split) x head dim x dtype x mask
the dispatch can pick, at ``ioattn.hopper.kernel_config`` (the launcher's own configuration).

Per kernel it prints shared memory, the registers ptxas reports (the launch budget; the partitions'
own budgets are the setmaxnreg values) and spills, and counts in the PTX of wgmma (and its
commit/wait groups), TMA (cp.async.bulk.tensor), setmaxnreg (with the values), mbarrier operations
(init with their arrival counts, arrive, arrive.expect_tx, try_wait) and named barriers (bar.sync /
bar.arrive per "id/threads"; ``barrier.sync 1`` is the warp-specialisation handshake). The ping-pong
structure shows as two consumer partitions with their own named barrier (two ids at 128 threads),
mbarrier.init with count 2 (K/V slots released by both warpgroups) and the turn arrives.

It also runs ptxas -v on the PTX (skip with --no-ptxas) and flags C7514 ("wgmma.mma_async
instructions are serialized"): the ping-pong variants must compile without it.

    python benchmarks/compile_check_hopper.py [--variants base,pingpong,split] [--no-ptxas] [--quick] [--jobs N]
"""
import argparse
import collections
import concurrent.futures
import multiprocessing
import os
import re
import subprocess
import tempfile
import time

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from ioattn import hopper
from ioattn.kernels.hopper_forward import hopper_fwd_kernel as fn

H200_SHARED_BYTES = 232448  # 227 KB: the most one block may opt in to (228 KB per SM)
SERIALIZED = "C7514"        # ptxas: "wgmma.mma_async instructions are serialized ..."


def compile_one(variant, d, dt, gdt, causal):
    cfg = hopper.kernel_config(d, variant)
    bn, q_rows = cfg["block_n"], cfg["q_rows"]
    q_layout = gl.NVMMASharedLayout.get_default_for([q_rows, d], gdt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
    sig = {n: "i32" for n in fn.arg_names}
    sig.update(q_desc=f"tensordesc<{dt}[{q_rows},{d}],{q_layout!r}>",
               k_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>",
               v_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>", Out=f"*{dt}", Lse="*fp32", qk_scale="fp32")
    c = dict(cfg["constexprs"], IS_CAUSAL=causal)
    # every constexpr parameter given (one left out would compile as an i32 argument, not its default)
    missing = [fn.arg_names[i] for i in fn.constexprs if fn.arg_names[i] not in c]
    assert not missing, missing
    sig.update({k: "constexpr" for k in c})
    k = triton.compile(GluonASTSource(fn, sig, c), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=cfg["num_warps"]))
    return cfg, k


def ptx_counts(ptx):
    mb_init = collections.Counter(re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64\s*\[[^\]]+\],\s*(\d+);", ptx))
    bars = collections.Counter()
    for kind, op, bid, n in re.findall(r"\b(bar|barrier)\.(sync|arrive)(?:\.aligned)?\s+(\d+)(?:,\s*(\d+))?;", ptx):
        bars[f"{'bar' if kind == 'bar' else 'barrier'}.{op} {bid}" + (f"/{n}" if n else "")] += 1
    return dict(
        wgmma=ptx.count("wgmma.mma_async"), commit=ptx.count("wgmma.commit_group"),
        waits=dict(collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", ptx))),
        tma=ptx.count("cp.async.bulk.tensor"),
        setmaxnreg=collections.Counter(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)),
        mb_init=mb_init, mb_arrive=len(re.findall(r"mbarrier\.arrive\.shared::cta\.b64", ptx)),
        mb_expect=ptx.count("mbarrier.arrive.expect_tx"), mb_wait=ptx.count("mbarrier.try_wait"), bars=bars)


def ptxas_report(ptx):
    """ptxas -v on the PTX: (registers, spill bytes, named barriers used, serialized?)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_90a", src, "-o", f"{tmp}/k.cubin"],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers(?:, used (\d+) barriers)?", out)
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    return int(regs.group(1)), spills, int(regs.group(2) or 0), SERIALIZED in out


def fmt(c):
    nreg = " ".join(f"{op}{v}x{n}" for (op, v), n in sorted(c["setmaxnreg"].items(),
                                                             key=lambda t: (t[0][0], int(t[0][1]))))
    init = ",".join(f"c{cnt}x{n}" for cnt, n in sorted(c["mb_init"].items()))
    bars = " ".join(f"{b}:{n}" for b, n in sorted(c["bars"].items()))
    waits = ",".join(f"w{k}x{n}" for k, n in sorted(c["waits"].items()))
    return (f"wgmma={c['wgmma']} (commit {c['commit']}, {waits}) tma={c['tma']} "
            f"setmaxnreg={sum(c['setmaxnreg'].values())} [{nreg}] "
            f"mbarrier(init={sum(c['mb_init'].values())} [{init}] arrive={c['mb_arrive']} expect_tx={c['mb_expect']} "
            f"try_wait={c['mb_wait']}) named[{bars}]")


DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16}


def check(job):
    """Compile one (variant, head dim, dtype, causal), assert its structure, return its report line."""
    variant, d, dt, causal, run_ptxas = job
    cfg, k = compile_one(variant, d, dt, DTYPES[dt], causal)
    ptx = k.asm["ptx"]
    c = ptx_counts(ptx)
    where = (variant, d, dt, causal)
    assert k.metadata.shared <= H200_SHARED_BYTES, (where, k.metadata.shared)
    assert c["wgmma"] and c["tma"] and c["setmaxnreg"], (where, c)
    if variant != "base":  # two consumer partitions, each with its own named barrier
        consumer_bars = {b for b in c["bars"] if b.startswith("bar.sync") and b.endswith("/128")}
        assert len(consumer_bars) >= 2, (where, c["bars"])
        assert c["mb_init"].get("2") == 2 * cfg["stages"], (where, c["mb_init"])  # K/V empties: both release
        assert c["setmaxnreg"][("inc", "240")] and c["setmaxnreg"][("dec", "24")], (where, c["setmaxnreg"])
    regs = ""
    if run_ptxas:
        nregs, spills, nbars, serialized = ptxas_report(ptx)
        regs = (f"regs={nregs} spill={spills}B bars_used={nbars} "
                f"{'SERIALIZED(C7514)' if serialized else 'wgmma-pipelined'} ")
        if variant != "base":
            assert not serialized and spills == 0, (where, "ptxas serialised the wgmmas or spilled")
    return (f"{variant:8s} d={d} {dt} causal={causal!s:5s} tiles={cfg['block_m']}x{cfg['block_n']}x{cfg['stages']} "
            f"warps={k.metadata.num_warps} shared={k.metadata.shared} {regs}{fmt(c)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(hopper.VARIANTS))
    ap.add_argument("--no-ptxas", action="store_true", help="skip the ptxas -v report (registers, spills, C7514)")
    ap.add_argument("--quick", action="store_true", help="bf16 only (fp16 compiles the same code but the dtype)")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="compiles in parallel")
    args = ap.parse_args()
    dtypes = ("bf16",) if args.quick else ("bf16", "fp16")
    jobs = [(variant, d, dt, causal, not args.no_ptxas) for variant in args.variants.split(",")
            for d in hopper.TILE_TABLE[variant] for dt in dtypes for causal in (False, True)]
    t0 = time.time()
    if args.jobs > 1:  # fork: the workers inherit the imports (no GPU, no CUDA context to inherit)
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as ex:
            for line in ex.map(check, jobs):
                print(line, flush=True)
    else:
        for job in jobs:
            print(check(job), flush=True)
    print(f"hopper kernel compiled for sm_90: {len(jobs)} kernels, variants {args.variants} "
          f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
