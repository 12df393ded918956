"""Compile the Gluon Hopper backward (``ioattn.kernels.hopper_backward``) for sm_90 without a GPU, at
the launcher's configuration (``hopper_backward.kernel_config``), for head dims 64 and 128 x bf16 /
fp16 x causal or not.

Per kernel it prints shared memory, and counts in the PTX of wgmma (with commit groups and waits),
TMA loads (cp.async.bulk.tensor), mbarrier operations, and global fp32 atomics / reductions (atom
or red .global .add, vectorised or not); it asserts shared memory <= 227 KB (an H200 block's opt-in
maximum) and that wgmma, TMA and the dQ atomics are there. Unless --no-ptxas: ptxas -v registers,
spill bytes, and whether ptxas serialised the wgmmas (warning C7514).

    python benchmarks/compile_check_hopper_bwd.py [--quick] [--no-ptxas] [--jobs N]
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

from ioattn.kernels.hopper_backward import hopper_bwd_dkdv_kernel as fn, kernel_config

H200_SHARED_BYTES = 232448  # 227 KB: the most one block may opt in to (228 KB per SM)
SERIALIZED = "C7514"        # ptxas: "wgmma.mma_async instructions are serialized ..."
DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16}


def compile_one(d, dt, causal):
    cfg = kernel_config(d)
    bm, bn = cfg["block_m"], cfg["block_n"]
    gdt = DTYPES[dt]
    q_layout = gl.NVMMASharedLayout.get_default_for([bm, d], gdt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], gdt)
    sig = {n: "i32" for n in fn.arg_names}
    sig.update(q_desc=f"tensordesc<{dt}[{bm},{d}],{q_layout!r}>", do_desc=f"tensordesc<{dt}[{bm},{d}],{q_layout!r}>",
               k_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>", v_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>",
               Lse="*fp32", Delta="*fp32", DQacc="*fp32", dK=f"*{dt}", dV=f"*{dt}", softmax_scale="fp32",
               qk_scale="fp32")
    c = dict(cfg["constexprs"], IS_CAUSAL=causal)
    missing = [fn.arg_names[i] for i in fn.constexprs if fn.arg_names[i] not in c]
    assert not missing, missing
    sig.update({k: "constexpr" for k in c})
    k = triton.compile(GluonASTSource(fn, sig, c), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=cfg["num_warps"]))
    return cfg, k


def ptx_counts(ptx):
    return dict(
        wgmma=ptx.count("wgmma.mma_async"), commit=ptx.count("wgmma.commit_group"),
        waits=dict(collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", ptx))),
        tma=ptx.count("cp.async.bulk.tensor"),
        mb_init=len(re.findall(r"mbarrier\.init\.", ptx)), mb_expect=ptx.count("mbarrier.arrive.expect_tx"),
        mb_wait=ptx.count("mbarrier.try_wait"),
        atomics=dict(collections.Counter(re.findall(r"\b((?:atom|red)(?:\.[a-z0-9_:]+)*\.add(?:\.[a-z0-9]+)*)", ptx))),
        bar_sync=len(re.findall(r"\bbar(?:rier)?\.sync\b", ptx)), fence_proxy=ptx.count("fence.proxy.async"))


def ptxas_report(ptx):
    """ptxas -v on the PTX: (registers, spill bytes, serialized?, C7514 line or '')."""
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_90a", src, "-o", f"{tmp}/k.cubin"],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    why = next((line.strip() for line in out.splitlines() if SERIALIZED in line), "")
    return int(regs.group(1)), spills, bool(why), why


def check(job):
    d, dt, causal, run_ptxas = job
    cfg, k = compile_one(d, dt, causal)
    ptx = k.asm["ptx"]
    c = ptx_counts(ptx)
    where = (d, dt, causal)
    assert k.metadata.shared <= H200_SHARED_BYTES, (where, k.metadata.shared)
    assert c["wgmma"] and c["tma"] and c["atomics"], (where, c)
    regs = ""
    if run_ptxas:
        nregs, spills, serialized, why = ptxas_report(ptx)
        regs = (f"regs={nregs} spill={spills}B {'SERIALIZED(C7514)' if serialized else 'wgmma-pipelined'} ")
        if serialized:
            regs += f"[{why[:160]}] "
    waits = ",".join(f"w{n}x{cnt}" for n, cnt in sorted(c["waits"].items()))
    atoms = " ".join(f"{op}x{n}" for op, n in sorted(c["atomics"].items()))
    return (f"bwd d={d} {dt} causal={causal!s:5s} tiles={cfg['block_m']}x{cfg['block_n']} warps={k.metadata.num_warps} "
            f"shared={k.metadata.shared} {regs}wgmma={c['wgmma']} (commit {c['commit']}, {waits}) tma={c['tma']} "
            f"mbarrier(init={c['mb_init']} expect_tx={c['mb_expect']} try_wait={c['mb_wait']}) "
            f"bar.sync={c['bar_sync']} fence.proxy.async={c['fence_proxy']} atomics[{atoms}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-ptxas", action="store_true", help="skip the ptxas -v report (registers, spills, C7514)")
    ap.add_argument("--quick", action="store_true", help="bf16 only (fp16 compiles the same code but the dtype)")
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="compiles in parallel")
    args = ap.parse_args()
    dtypes = ("bf16",) if args.quick else ("bf16", "fp16")
    jobs = [(int(d), dt, causal, not args.no_ptxas) for d in args.headdims.split(",") for dt in dtypes
            for causal in (False, True)]
    t0 = time.time()
    if args.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as ex:
            for line in ex.map(check, jobs):
                print(line, flush=True)
    else:
        for job in jobs:
            print(check(job), flush=True)
    print(f"hopper backward compiled for sm_90: {len(jobs)} kernels ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
