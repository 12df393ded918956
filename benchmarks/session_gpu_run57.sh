#!/usr/bin/env bash
# Device call D of 2026-12-02 (ninth session): the train sweep for the README table, every head dim,
# SDPA's flash and cuDNN backends in the same run (the backward changed by NOTES §52-§55 since -zm).
# Usage: bash benchmarks/session_gpu_run57.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/train"
timeout 420 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
python3 benchmarks/train_vs_cudnn.py "$out/train/results.jsonl" --modes fwd,bwd
