#!/usr/bin/env bash
# NOTES §154 after the change: the project's benchmark at the padded head dims, the default dispatch
# (PADDED_MIN_SEQLEN from run224, the pads by F.pad) against SDPA's cuDNN backend in the same run:
# ioattn bench train --headdims 80,96,192 --providers ioattn,sdpa-cudnn (16k tokens, hidden 2048, N = 512
# to 16384, both masks, forward and backward).
# Usage: bash benchmarks/session_gpu_run225.sh OUT   (writes OUT/summary.log, OUT/train/)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
{
t0=$(date +%s)
timeout 400 python3 -m ioattn bench train --headdims 80,96,192 --providers ioattn,sdpa-cudnn --out "$out/train" \
    > "$out/train.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"
tail -n 60 "$out/train.log"
} 2>&1 | tee "$out/summary.log"
