#!/usr/bin/env bash
# The bf16 train sweep with every provider in one run (issue 3): ours (ioattn = the default dispatch,
# ioattn-ptr = the portable kernel with pointer loads, ioattn-hopper = the Gluon forward wherever it
# applies), SDPA's four backends and FlexAttention (compiled for the grid first, in parallel).
# Usage: bash benchmarks/session_gpu_run9.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 120 python3 benchmarks/flex_prewarm.py --workers 12 > "$out/prewarm.log" 2>&1
echo "prewarm rc=$?"; tail -n 1 "$out/prewarm.log"
mkdir -p "$out/train"
timeout 440 python3 -m ioattn bench train \
    --providers ioattn,ioattn-ptr,ioattn-hopper,sdpa-flash,sdpa-cudnn,sdpa-efficient,sdpa-math,flex \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
grep -c "cannot run" "$out/train.log"; tail -n 3 "$out/train.log"
