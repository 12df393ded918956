#!/usr/bin/env bash
# The A/B of the Gluon forward's sliding-window form (NOTES §145): ab_window.py --pass fwd, Gluon /
# portable at every head dim, FlexAttention at d = 128 in the same run, windows (32, 0) to (4096, 0),
# N = 4096 and 16384.
# Usage: bash benchmarks/session_gpu_run202.sh OUT        (writes OUT/summary.log, OUT/ab_window_fwd.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 560 python3 benchmarks/ab_window.py --pass fwd --out "$out" --headdims 128,64,256 --seqlens 4096,16384 \
    --windows 32:0,64:0,128:0,256:0,1024:0,4096:0 --providers gluon,portable,flex --flex-headdims 128
echo "ab_window fwd rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
