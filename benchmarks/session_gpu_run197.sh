#!/usr/bin/env bash
# NOTES §144: the backward with a sliding window, Gluon (ws, WINDOW) / portable / FlexAttention (d = 128)
# (ab_window.py), every head dim, N = 4096 and 16384, windows (256, 0), (1024, 0), (4096, 0).
# Usage: bash benchmarks/session_gpu_run197.sh OUT        (writes OUT/summary.log, OUT/ab_window.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 500 python3 benchmarks/ab_window.py --out "$out" > "$out/ab_window.log" 2>&1
echo "ab_window rc=$? $(( $(date +%s) - t0 ))s"
grep -v -i warn "$out/ab_window.log" | tail -24
} 2>&1 | tee "$out/summary.log"
