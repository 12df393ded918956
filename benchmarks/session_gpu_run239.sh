#!/usr/bin/env bash
# NOTES §157-§159, after the split products in both passes and dQ's 64-column high half: the project's benchmark at d = 192 (the
# padded head dim they serve), the peer in the same run.
# Usage: bash benchmarks/session_gpu_run239.sh OUT   (writes OUT/summary.log, OUT/train.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 300 python3 -m ioattn bench train --headdims 192 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"
tail -n 45 "$out/train.log"
} 2>&1 | tee "$out/summary.log"
