#!/usr/bin/env bash
# ALiBi at short lengths (NOTES §148): ab_window.py --alibi, forward and backward, Gluon against the portable
# kernels, every head dim, N = 512 / 1024 / 2048, no window and causal (the lengths' table decides there).
# Usage: bash benchmarks/session_gpu_run212.sh OUT   (writes OUT/summary.log, OUT/ab_window_fwd.jsonl, OUT/ab_window.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
for pass in fwd bwd; do
    t0=$(date +%s)
    timeout 200 python3 benchmarks/ab_window.py --pass $pass --alibi --out "$out" --headdims 128,256,64 \
        --seqlens 512,1024,2048 --windows=-1:-1,-1:0 --providers gluon,portable
    echo "ab_window $pass alibi short rc=$? $(( $(date +%s) - t0 ))s"
done
} 2>&1 | tee "$out/summary.log"
