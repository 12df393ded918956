#!/usr/bin/env bash
# NOTES §155, after the in-place padded path (PADDED_IN_PLACE_MIN_SEQLEN: 512 everywhere, run228): the
# project's benchmark at the padded head dims, the peer in the same run.
# Usage: bash benchmarks/session_gpu_run229.sh OUT   (writes OUT/summary.log, OUT/train.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 400 python3 -m ioattn bench train --headdims 80,96,192 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"
tail -n 80 "$out/train.log"
} 2>&1 | tee "$out/summary.log"
