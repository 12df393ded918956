#!/usr/bin/env bash
# The softcap backward at short lengths (NOTES §147): ab_window.py --pass bwd --softcap 50, Gluon against the
# portable backward, every head dim, N = 512 / 1024 / 2048, no window and causal (the lengths' table decides there).
# Usage: bash benchmarks/session_gpu_run209.sh OUT   (writes OUT/summary.log, OUT/ab_window.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 400 python3 benchmarks/ab_window.py --pass bwd --softcap 50 --out "$out" --headdims 128,256,64 \
    --seqlens 512,1024,2048 --windows=-1:-1,-1:0 --providers gluon,portable
echo "ab_window bwd softcap short rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
