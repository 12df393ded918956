#!/usr/bin/env bash
# The bf16 train sweep with FlexAttention (compiled for the grid first, in parallel) beside ioattn and
# SDPA flash/cuDNN. Usage: bash benchmarks/session_gpu_run7.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 benchmarks/flex_prewarm.py --headdims 64,128,256 --workers 12 > "$out/prewarm.log" 2>&1
echo "prewarm rc=$?"; tail -n 1 "$out/prewarm.log"
mkdir -p "$out/train"
timeout 400 python3 -m ioattn bench train --providers ioattn,sdpa-flash,sdpa-cudnn,flex \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
grep -c '"provider": "flex"' "$out/train/results.jsonl"; grep -c "cannot run" "$out/train.log"
grep -E "^flex" "$out/train.log" | tail -n 3
