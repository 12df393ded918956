#!/usr/bin/env bash
# ALiBi in both Gluon kernels against the portable kernels and FlexAttention (NOTES §148): ab_window.py --alibi,
# the forward and the backward, every head dim, FlexAttention at d = 128; no window, causal and (4096, 0);
# N = 4096 and 16384.
# Usage: bash benchmarks/session_gpu_run211.sh OUT   (writes OUT/summary.log, OUT/ab_window_fwd.jsonl, OUT/ab_window.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
for pass in fwd bwd; do
    t0=$(date +%s)
    timeout 270 python3 benchmarks/ab_window.py --pass $pass --alibi --out "$out" --headdims 128,256,64 \
        --seqlens 4096,16384 --windows=-1:-1,-1:0,4096:0 --providers gluon,portable,flex --flex-headdims 128
    echo "ab_window $pass alibi rc=$? $(( $(date +%s) - t0 ))s"
done
} 2>&1 | tee "$out/summary.log"
