#!/usr/bin/env bash
# Device call B of 2026-12-01 (fourth session): (1) `ioattn bench decode` (issue 4's table, the paged
# batch 1 x 4096 launch restored in NOTES §33); (2) ab_decode --cases rest --rounds 2: split count,
# stages and warps at the contiguous cases where eager ioattn trailed cuDNN.
# Usage: bash benchmarks/session_gpu_run19.sh OUT
set -u
out=${1:?outdir}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$out/decode"
timeout 120 python3 -m ioattn bench decode --out "$out/decode" --providers ioattn,ioattn-graph,ioattn-paged,sdpa-cudnn \
    > "$out/decode.log" 2>&1
echo "decode rc=$?"; rm -f "$out"/decode/*.png
timeout 200 python3 benchmarks/ab_decode.py --out "$out" --cases rest --rounds 2 > "$out/ab_decode_rest.log" 2>&1
echo "ab_decode rc=$?"
grep -A 9 "== decode sweep" "$out/decode.log" | cut -c1-150
grep -A 40 "median over rounds" "$out/ab_decode_rest.log"
