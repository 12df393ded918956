"""Compile FlexAttention for every shape of a train sweep in parallel processes, so that the
measured sweep (one process, one shape after another) finds Inductor's on-disk caches warm.

torch.compile(flex_attention, dynamic=False) compiles once per shape, mask and grad mode, about
20 s each on the device's CPU; the train grid has 12 shapes per head dim. Compile time is never part
of a measured time (warm-up is excluded); this only shortens the wall time of the run.

    python benchmarks/flex_prewarm.py --headdims 64,128,256 [--dtype bf16] [--workers 8]
    python -m ioattn bench train --providers flex,... --out DIR   # then, as usual
"""
import argparse
import multiprocessing as mp
import sys
import time


def _warm(job):
    import torch

    from ioattn.bench.providers import providers
    from ioattn.bench.run import DTYPES, GPU_SWEEPS, _shape

    d, n, causal, dtype_name = job
    fn = providers(["flex"])["flex"][0]
    shape = _shape(GPU_SWEEPS["train"], d, n)
    q, k, v = (torch.randn(shape, device="cuda", dtype=DTYPES[dtype_name]) for _ in range(3))
    t0 = time.time()
    try:
        fn(q, k, v, causal)                      # the correctness check's call (inputs without grad)
        with torch.no_grad():
            fn(q, k, v, causal)                  # the fwd mode
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(fn(*leaves, causal), leaves, torch.randn_like(q))  # bwd and fwdbwd
        torch.cuda.synchronize()
        return f"d={d} n={n} causal={int(causal)}: {time.time() - t0:.0f} s"
    except Exception as e:  # noqa: BLE001 - the sweep reports it again, per shape
        return f"d={d} n={n} causal={int(causal)}: {type(e).__name__}: {str(e).splitlines()[0][:160]}"


def main():
    from ioattn.bench.run import GPU_SWEEPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--seqlens", default=",".join(map(str, GPU_SWEEPS["train"].seqlens)))
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    jobs = [(d, n, c, args.dtype) for d in map(int, args.headdims.split(",")) for c in (False, True)
            for n in map(int, args.seqlens.split(","))]
    t0 = time.time()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for line in pool.imap_unordered(_warm, jobs):
            print(line, flush=True)
    print(f"prewarmed {len(jobs)} flex shapes in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
