#!/usr/bin/env bash
# NOTES §156, continued: the softcap and ALiBi forms (ab_window.py --softcap 50 / --alibi, no mask and
# causal) and packed sequences (ab_varlen.py) at padded head dims in place, forward and backward, Gluon
# against the portable kernels.
# Usage: bash benchmarks/session_gpu_run232.sh OUT   (writes OUT/summary.log, OUT/{cap,alibi,varlen}/*.jsonl)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
for p in fwd bwd; do
    t0=$(date +%s)
    timeout 120 python3 benchmarks/ab_window.py --out "$out/cap" --pass $p --headdims 96,192 --seqlens 2048,16384 \
        --windows=-1:-1,-1:0 --providers gluon,portable --softcap 50
    echo "softcap $p rc=$? $(( $(date +%s) - t0 ))s"
    t0=$(date +%s)
    timeout 120 python3 benchmarks/ab_window.py --out "$out/alibi" --pass $p --headdims 96,192 --seqlens 2048,16384 \
        --windows=-1:-1,-1:0 --providers gluon,portable --alibi
    echo "alibi $p rc=$? $(( $(date +%s) - t0 ))s"
    t0=$(date +%s)
    timeout 100 python3 benchmarks/ab_varlen.py --out "$out/varlen" --pass $p --headdims 96,192 --means 512,2048 \
        --providers gluon,portable
    echo "varlen $p rc=$? $(( $(date +%s) - t0 ))s"
done
} 2>&1 | tee "$out/summary.log"
