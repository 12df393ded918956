#!/usr/bin/env bash
# (1) d=64 forward tile A/B at the two marginal issue-2 points (N=512 non-causal, N=4096 causal),
# TMA and TMA + persistent grid; (2) FlexAttention compiled for the whole bf16 train grid in parallel
# (benchmarks/flex_prewarm.py); (3) the bf16 train sweep with flex and sdpa-math beside ioattn and
# SDPA flash/cuDNN. Usage: bash benchmarks/session_gpu_run6.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 110 python3 benchmarks/ab_fwd.py --out "$out" --tag ab_d64 --loads tma,tma-pers --headdims 64 \
    --seqlens 512,4096 --tiles "default;64,64,4,3;128,64,8,3;128,128,8,2;64,64,4,4;64,128,4,4" > "$out/ab_d64.log" 2>&1
echo "ab rc=$?"
timeout 180 python3 benchmarks/flex_prewarm.py --headdims 64,128,256 --workers 12 > "$out/prewarm.log" 2>&1
echo "prewarm rc=$?"; tail -n 1 "$out/prewarm.log"
mkdir -p "$out/train"
timeout 280 python3 -m ioattn bench train --providers ioattn,sdpa-flash,sdpa-cudnn,flex,sdpa-math \
    --out "$out/train" > "$out/train.log" 2>&1
echo "train rc=$?"; rm -f "$out"/train/*.png
grep -c '"provider": "flex"' "$out/train/results.jsonl"
grep -E "^flex|^sdpa-math" "$out/train.log" | tail -n 4
tail -n 6 "$out/ab_d64.log"
