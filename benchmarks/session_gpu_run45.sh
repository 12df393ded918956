#!/usr/bin/env bash
# Device call D of 2026-12-01 (seventh session): NOTES §47, the lean softmax on by default.
# (1) GPU tests of the forward variants with it (persistent included, negative scale, dispatch);
# (2) ab_fwd: persistent with / without it against ping-pong with it, non-causal N=1024 / 4096
#     (PERSISTENT_MAX_SEQLEN's range), 2 rounds with rest;
# (3) the train sweep, every head dim, cuDNN and SDPA flash in the same run.
# Usage: bash benchmarks/session_gpu_run45.sh OUT        (at most 8 files under OUT)
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 100 python3 -m pytest tests/test_gpu.py -n 8 -q -p no:cacheprovider -rfE \
    -k "hopper_forward_persistent or negative_scale or default_dispatch or next_batch or test_hopper_forward_varlen" \
    > "$out/test_gpu.log" 2>&1
echo "tests rc=$?"; tail -n 1 "$out/test_gpu.log"; grep -E "FAILED|ERROR" "$out/test_gpu.log" | head -n 5
timeout 100 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_pers --headdims 64,128,256 --seqlens 1024,4096 \
    --causal 0 --loads gluon-pers-lean,gluon-pers-nolean,gluon-pp-lean --rounds 2 --rest 0.2 > "$out/ab_pers.log" 2>&1
echo "ab rc=$?"; tail -n 8 "$out/ab_pers.log"
mkdir -p "$out/train"
timeout 340 python3 -m ioattn bench train --headdims 64,128,256 --providers ioattn,sdpa-flash,sdpa-cudnn \
    --out "$out/train" > "$out/train/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
python3 benchmarks/train_vs_cudnn.py "$out/train/results.jsonl" --modes fwd,bwd
