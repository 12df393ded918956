#!/usr/bin/env bash
# Device call B of 2026-12-02 (tenth session): the defaults NOTES §57 / §58 measured faster (the
# forward's output as whole rows at d = 64 / 128, d = 256's dK / dV through the Q ring; d = 128 causal
# on the Gluon forward from N = 1024): (1) every Gluon forward test (each variant, mask, dtype, varlen,
# persistent, LPT, exp2 on FMA, rows past each sequence) with the defaults, the default-dispatch test
# and d = 256's backward through the API; (2) the train sweep for the README table, every head dim,
# SDPA's flash and cuDNN backends in the same run.
# Usage: bash benchmarks/session_gpu_run61.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 240 python3 -m pytest tests/test_gpu.py -n 8 -q -p no:cacheprovider -rfE \
    -k "hopper_forward and not accumulator_stores or default_dispatch or d256_through_the_api" \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
mkdir -p "$out/train"
timeout 300 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
python3 benchmarks/train_vs_cudnn.py "$out/train/results.jsonl" --modes fwd,bwd
