#!/usr/bin/env bash
# The Gluon backward's softcap form against the portable backward and FlexAttention (NOTES §147):
# ab_window.py --pass bwd --softcap 50, every head dim, d = 128 also as the column split (gluon-cs),
# FlexAttention at d = 128; no window, causal and (4096, 0); N = 4096 and 16384.
# Usage: bash benchmarks/session_gpu_run208.sh OUT   (writes OUT/summary.log, OUT/ab_window.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 540 python3 benchmarks/ab_window.py --pass bwd --softcap 50 --out "$out" --headdims 128,256,64 \
    --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,gluon-cs,portable,flex --flex-headdims 128
echo "ab_window bwd softcap rc=$? $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$out/summary.log"
