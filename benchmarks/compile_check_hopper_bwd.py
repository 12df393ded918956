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
import os
import sys
import time

from triton.experimental.gluon import language as gl

from ioattn.kernels.hopper_backward import hopper_bwd_dkdv_kernel as fn, kernel_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_aot import DTYPES, H200_SHARED_BYTES, compile_sm90, ptx_counts, ptxas_report, run_jobs  # noqa: E402


def compile_one(d, dt, causal):
    cfg = kernel_config(d)
    bm, bn = cfg["block_m"], cfg["block_n"]
    q_layout = gl.NVMMASharedLayout.get_default_for([bm, d], DTYPES[dt])
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, d], DTYPES[dt])
    sig = {n: "i32" for n in fn.arg_names}
    sig.update(q_desc=f"tensordesc<{dt}[{bm},{d}],{q_layout!r}>", do_desc=f"tensordesc<{dt}[{bm},{d}],{q_layout!r}>",
               k_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>", v_desc=f"tensordesc<{dt}[{bn},{d}],{kv_layout!r}>",
               Lse="*fp32", Delta="*fp32", DQacc="*fp32", dK=f"*{dt}", dV=f"*{dt}", softmax_scale="fp32",
               qk_scale="fp32")
    return cfg, compile_sm90(fn, sig, dict(cfg["constexprs"], IS_CAUSAL=causal), cfg["num_warps"])


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
        nregs, spills, _, why = ptxas_report(ptx)
        serialized = bool(why)
        regs = (f"regs={nregs} spill={spills}B {'SERIALIZED(C7514)' if serialized else 'wgmma-pipelined'} ")
        if serialized:
            regs += f"[{why[:160]}] "
    waits = ",".join(f"w{n}x{cnt}" for n, cnt in sorted(c["waits"].items()))
    atoms = " ".join(f"{op}x{n}" for op, n in sorted(c["atomics"].items()))
    return (f"bwd d={d} {dt} causal={causal!s:5s} tiles={cfg['block_m']}x{cfg['block_n']} warps={k.metadata.num_warps} "
            f"shared={k.metadata.shared} {regs}wgmma={c['wgmma']} (commit {c['commit']}, {waits}) tma={c['tma']} "
            f"mbarrier(init={sum(c['mb_init'].values())} expect_tx={c['mb_expect']} try_wait={c['mb_wait']}) "
            f"bar.sync={sum(n for b, n in c['bars'].items() if '.sync' in b)} fence.proxy.async={c['fence_proxy']} "
            f"atomics[{atoms}]")


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
    run_jobs(check, jobs, args.jobs)
    print(f"hopper backward compiled for sm_90: {len(jobs)} kernels ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
